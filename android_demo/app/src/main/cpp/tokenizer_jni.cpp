// JNI layer of the demo's tokenizer: org.hyflash.demo.TokenizerNative over the tokenizer library
// ExecuTorch builds for its LLM runner (pytorch/tokenizers, HFTokenizer reads the bundle's
// tokenizer.json). Android only: the executorch pip wheel carries that library inside its
// Python extension, without the headers' dependencies (nlohmann/json, re2), so the host
// check builds hyflash_jni.cpp alone.
#include <jni.h>
#include <pytorch/tokenizers/hf_tokenizer.h>

#include <memory>
#include <string>
#include <vector>

namespace {

void throw_java(JNIEnv* env, const std::string& message) {
  jclass cls = env->FindClass("java/lang/IllegalArgumentException");
  if (cls != nullptr) env->ThrowNew(cls, message.c_str());
}

}  // namespace

extern "C" {

JNIEXPORT jlong JNICALL Java_org_hyflash_demo_TokenizerNative_open(JNIEnv* env, jclass,
                                                             jstring path) {
  const char* chars = env->GetStringUTFChars(path, nullptr);
  std::string file(chars);
  env->ReleaseStringUTFChars(path, chars);
  auto tok = std::make_unique<tokenizers::HFTokenizer>();
  if (tok->load(file) != tokenizers::Error::Ok) {
    throw_java(env, "cannot read the tokenizer " + file +
                    ": copy the whole bundle folder (tokenizer.json is part of it)");
    return 0;
  }
  return reinterpret_cast<jlong>(tok.release());
}

// Text crosses JNI as UTF-8 bytes: JNI's own string functions speak modified UTF-8, which
// spells characters outside the BMP (emoji) differently from the tokenizer's UTF-8.
JNIEXPORT jintArray JNICALL Java_org_hyflash_demo_TokenizerNative_encode(JNIEnv* env, jclass,
                                                                   jlong handle,
                                                                   jbyteArray utf8) {
  auto* tok = reinterpret_cast<tokenizers::HFTokenizer*>(handle);
  std::string text(size_t(env->GetArrayLength(utf8)), '\0');
  env->GetByteArrayRegion(utf8, 0, jsize(text.size()), reinterpret_cast<jbyte*>(&text[0]));
  auto ids = tok->encode(text, /*bos=*/0, /*eos=*/0);
  if (!ids.ok()) {
    throw_java(env, "the tokenizer could not encode the prompt");
    return nullptr;
  }
  std::vector<jint> out(ids.get().begin(), ids.get().end());
  jintArray array = env->NewIntArray(jsize(out.size()));
  env->SetIntArrayRegion(array, 0, jsize(out.size()), out.data());
  return array;
}

JNIEXPORT jbyteArray JNICALL Java_org_hyflash_demo_TokenizerNative_decode(JNIEnv* env, jclass,
                                                                    jlong handle,
                                                                    jintArray ids) {
  auto* tok = reinterpret_cast<tokenizers::HFTokenizer*>(handle);
  std::vector<uint64_t> tokens(size_t(env->GetArrayLength(ids)));
  jint* raw = env->GetIntArrayElements(ids, nullptr);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint64_t(raw[i]);
  env->ReleaseIntArrayElements(ids, raw, JNI_ABORT);
  auto text = tok->decode(tokens, /*skip_special_tokens=*/true);
  if (!text.ok()) {
    throw_java(env, "the tokenizer could not decode the completion");
    return nullptr;
  }
  const std::string& bytes = text.get();
  jbyteArray out = env->NewByteArray(jsize(bytes.size()));
  env->SetByteArrayRegion(out, 0, jsize(bytes.size()),
                          reinterpret_cast<const jbyte*>(bytes.data()));
  return out;
}

JNIEXPORT void JNICALL Java_org_hyflash_demo_TokenizerNative_close(JNIEnv*, jclass, jlong handle) {
  delete reinterpret_cast<tokenizers::HFTokenizer*>(handle);
}

}  // extern "C"
