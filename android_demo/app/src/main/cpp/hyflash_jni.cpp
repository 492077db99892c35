// JNI layer of the Android demo: org.hyflash.demo.NativeEngine over the C++ runtime
// (runtime_native/). Token ids in, token ids and stats out, as JSON; every problem becomes
// a java.lang.IllegalArgumentException carrying the runtime's one-line message. Kept free
// of Android headers so the host JVM can load it too (android_demo/host_check/).
#include <jni.h>

#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "error.h"
#include "manifest.h"
#include "program.h"

namespace {

// One opened bundle: the program and the two backends over its methods.
struct Session {
  hyflash::Program program;
  hyflash::ExecuTorchTarget target;
  hyflash::ExecuTorchDrafter drafter;

  Session(const std::string& bundle, int threads)
      : program(hyflash::read_manifest(bundle), threads), target(program), drafter(program) {}
};

void throw_java(JNIEnv* env, const std::string& message) {
  jclass cls = env->FindClass("java/lang/IllegalArgumentException");
  if (cls != nullptr) env->ThrowNew(cls, message.c_str());
}

std::string utf8(JNIEnv* env, jstring text) {
  const char* chars = env->GetStringUTFChars(text, nullptr);
  std::string out(chars ? chars : "");
  if (chars) env->ReleaseStringUTFChars(text, chars);
  return out;
}

std::string ids_json(const std::vector<int64_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

}  // namespace

extern "C" {

JNIEXPORT jlong JNICALL Java_org_hyflash_demo_NativeEngine_open(JNIEnv* env, jclass,
                                                                jstring bundle, jint threads) {
  try {
    return reinterpret_cast<jlong>(new Session(utf8(env, bundle), int(threads)));
  } catch (const std::exception& e) {
    throw_java(env, e.what());
    return 0;
  }
}

JNIEXPORT jstring JNICALL Java_org_hyflash_demo_NativeEngine_generate(
    JNIEnv* env, jclass, jlong handle, jintArray prompt, jint max_new_tokens, jboolean draft) {
  auto* session = reinterpret_cast<Session*>(handle);
  if (session == nullptr) {
    throw_java(env, "the engine is closed: open a bundle first");
    return nullptr;
  }
  try {
    std::vector<int64_t> ids(size_t(env->GetArrayLength(prompt)));
    jint* raw = env->GetIntArrayElements(prompt, nullptr);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = raw[i];
    env->ReleaseIntArrayElements(prompt, raw, JNI_ABORT);
    hyflash::Engine engine(session->target, draft ? &session->drafter : nullptr);
    hyflash::Generation g =
        engine.generate(ids, max_new_tokens, session->program.manifest().eos_ids);
    std::string json = "{\"tokens\": " + ids_json(g.tokens) +
                       ", \"stats\": " + hyflash::stats_json(g.stats) + "}";
    return env->NewStringUTF(json.c_str());
  } catch (const std::exception& e) {
    throw_java(env, e.what());
    return nullptr;
  }
}

JNIEXPORT void JNICALL Java_org_hyflash_demo_NativeEngine_close(JNIEnv*, jclass, jlong handle) {
  delete reinterpret_cast<Session*>(handle);
}

}  // extern "C"
