// ExecuTorch program and backends (see program.h).
#include "program.h"

#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/platform/platform.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "error.h"

// The wheel ships libexecutorch_threadpool.so but not its header; these two declarations
// are its API as ExecuTorch 1.5.1 defines it (extension/threadpool/threadpool.h).
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace hyflash {

using executorch::aten::ScalarType;
using executorch::runtime::EValue;
namespace et = executorch::runtime;

namespace {

constexpr int64_t kProgramFormat = 2;  // hyflash.export.executorch.FORMAT this reads
const char* const kReexport = "re-export it with `hyflash export --backend executorch`";

// ExecuTorch logs through its platform layer; its messages are kept (the last error is
// named in ours) and printed only with HYFLASH_ET_LOG=1, so a failure stays one line.
std::string& last_log() {
  static std::string text;
  return text;
}

void on_log(et_timestamp_t, et_pal_log_level_t level, const char*, const char*, size_t,
            const char* message, size_t length) {
  std::string text(message, length);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (level == et_pal_log_level_t::kError || level == et_pal_log_level_t::kFatal)
    last_log() = text;
  const char* verbose = std::getenv("HYFLASH_ET_LOG");
  if (verbose && *verbose && std::strcmp(verbose, "0") != 0)
    std::fprintf(stderr, "executorch %c: %s\n", char(level), text.c_str());
}

void install_log_sink() {
  static const bool installed = [] {
    return et::register_pal(et::PalImpl::create(on_log, __FILE__));
  }();
  (void)installed;
}

std::string et_detail(et::Error e) {
  std::string out = "ExecuTorch error " + std::to_string(int(e));
  if (!last_log().empty()) out += ": " + last_log();
  return out;
}

const std::map<std::string, std::pair<ScalarType, size_t>>& dtypes() {
  static const std::map<std::string, std::pair<ScalarType, size_t>> table = {
      {"float32", {ScalarType::Float, 4}}, {"float16", {ScalarType::Half, 2}},
      {"bfloat16", {ScalarType::BFloat16, 2}}, {"int64", {ScalarType::Long, 8}},
      {"int32", {ScalarType::Int, 4}}, {"bool", {ScalarType::Bool, 1}}};
  return table;
}

std::string dtype_name(ScalarType t) {
  for (const auto& [name, info] : dtypes())
    if (info.first == t) return name;
  return "scalar type " + std::to_string(int(t));
}

std::vector<int32_t> sizes_of(const std::vector<int64_t>& shape) {
  return std::vector<int32_t>(shape.begin(), shape.end());
}

// Copies a float tensor output into out (resized), checking its element count.
void copy_floats(const EValue& v, size_t want, std::vector<float>& out, size_t at,
                 const std::string& what) {
  if (!v.isTensor()) throw Error(what + " is not a tensor: " + kReexport);
  const executorch::aten::Tensor t = v.toTensor();
  if (t.scalar_type() != ScalarType::Float || size_t(t.numel()) != want)
    throw Error(what + " has " + std::to_string(t.numel()) + " " + dtype_name(t.scalar_type()) +
                " values, expected " + std::to_string(want) + " float32: " + kReexport);
  std::memcpy(out.data() + at, t.const_data_ptr<float>(), want * sizeof(float));
}

}  // namespace

// ------------------------------------------------------------------------ Program

Program::Program(Manifest manifest, int threads) : manifest_(std::move(manifest)) {
  install_log_sink();
  if (threads > 0)
    executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(
        uint32_t(threads));
  path_ = manifest_.folder + "/" + manifest_.program_file;
  module_ = std::make_unique<executorch::extension::Module>(
      path_, executorch::extension::Module::LoadMode::Mmap, nullptr, nullptr, nullptr,
      /*share_memory_arenas=*/true);
  et::Error e = module_->load();
  if (e != et::Error::Ok)
    throw Error("ExecuTorch cannot load " + path_ + " (" + et_detail(e) +
                "): the file is damaged; " + kReexport);
  auto names = module_->method_names();
  if (!names.ok() || !names->count("get_hyflash_format"))
    throw Error(path_ + " is not a hyflash ExecuTorch program (no get_hyflash_format "
                "method): " + kReexport);
  int64_t version = constant("get_hyflash_format");
  if (version != kProgramFormat)
    throw Error(path_ + " has program format " + std::to_string(version) +
                ", this hyflash-run reads " + std::to_string(kProgramFormat) + ": " +
                kReexport + " and rebuild hyflash-run from the same hyflash");
  const Manifest& m = manifest_;
  for (const auto& [name, want] :
       std::vector<std::pair<std::string, int64_t>>{
           {"get_vocab_size", m.vocab_size}, {"get_max_context_len", m.max_seq_len},
           {"get_block_size", m.block_size}, {"get_feature_size", m.feature_size},
           {"get_feature_rows", m.role("target").rows},
           {"get_commit_rows", m.role("drafter_commit").rows}})
    if (constant(name) != want)
      mismatch(name + " returns " + std::to_string(constant(name)) +
               ", the manifest records " + std::to_string(want));
  for (const auto& [role, contract] : m.methods) {
    if (!names->count(contract.method))
      mismatch("it has no method '" + contract.method + "'");
    check_io(contract);
    // loaded now (XNNPACK packs its weights here), not inside the first timed call
    et::Error loaded = module_->load_method(contract.method);
    if (loaded != et::Error::Ok)
      throw Error("ExecuTorch cannot load method " + contract.method + " of " + path_ + " (" +
                  et_detail(loaded) + "): " + kReexport);
  }
}

void Program::mismatch(const std::string& what) const {
  throw Error(manifest_.program_file + " does not match manifest.json: " + what +
              "; the program was replaced or edited after export: " + kReexport);
}

int64_t Program::constant(const std::string& method) {
  auto out = module_->execute(method);
  if (!out.ok() || out->empty() || !(*out)[0].isInt())
    throw Error(path_ + ": constant method " + method + " failed (" +
                et_detail(out.ok() ? et::Error::InvalidProgram : out.error()) + "): " +
                kReexport);
  return (*out)[0].toInt();
}

void Program::check_io(const MethodContract& c) {
  auto meta = module_->method_meta(c.method);
  if (!meta.ok()) mismatch("method " + c.method + " has no metadata");
  auto check = [&](const char* kind, size_t count, auto info_at,
                   const std::vector<TensorSpec>& specs) {
    if (count != specs.size())
      mismatch("method " + c.method + " has " + std::to_string(count) + " " + kind +
               "s, the manifest records " + std::to_string(specs.size()));
    for (size_t i = 0; i < count; ++i) {
      auto info = info_at(i);
      const TensorSpec& spec = specs[i];
      if (!info.ok()) mismatch(std::string(kind) + " " + spec.name + " is not a tensor");
      auto sizes = info->sizes();
      bool same = dtype_name(info->scalar_type()) == spec.dtype &&
                  sizes.size() == spec.shape.size();
      for (size_t d = 0; same && d < sizes.size(); ++d)
        same = spec.shape[d] == kDynamic || spec.shape[d] == sizes[d];
      if (!same)
        mismatch(std::string(kind) + " '" + spec.name + "' of " + c.method + " is " +
                 dtype_name(info->scalar_type()) + " of rank " +
                 std::to_string(sizes.size()) + ", not what the manifest records");
    }
  };
  check("input", meta->num_inputs(), [&](size_t i) { return meta->input_tensor_meta(i); },
        c.inputs);
  check("output", meta->num_outputs(), [&](size_t i) { return meta->output_tensor_meta(i); },
        c.outputs);
}

std::vector<EValue> Program::run(const std::string& method, const std::vector<EValue>& inputs) {
  auto out = module_->execute(method, inputs);
  if (!out.ok())
    throw Error("method " + method + " of " + path_ + " failed (" + et_detail(out.error()) +
                ")");
  return std::move(*out);
}

// ------------------------------------------------------------------------ target

ExecuTorchTarget::ExecuTorchTarget(Program& program)
    : program_(program),
      forward_method_(program.manifest().role("forward").method),
      features_method_(program.manifest().role("target").method),
      vocab_(program.manifest().vocab_size),
      features_(program.manifest().feature_size),
      max_seq_len_(program.manifest().max_seq_len),
      rows_(program.manifest().role("target").rows) {}

void ExecuTorchTarget::forward(const std::vector<int64_t>& tokens, int64_t start_pos,
                               std::vector<float>& logits, std::vector<float>& features) {
  const int64_t n = int64_t(tokens.size()), end = start_pos + n;
  if (start_pos < 0 || start_pos > length_)
    throw Error("forward at position " + std::to_string(start_pos) + " would leave a gap in "
                "the KV cache, which holds " + std::to_string(length_) + " positions");
  if (end > max_seq_len_)
    throw Error("positions " + std::to_string(start_pos) + ".." + std::to_string(end - 1) +
                " do not fit the target's context of " + std::to_string(max_seq_len_) +
                " tokens");
  logits.resize(size_t(n * vocab_));
  features.resize(size_t(n * features_));
  std::vector<int64_t> ids;
  for (int64_t at = 0; at < n; at += rows_) {  // the feature ring holds rows_ positions
    const int64_t t = std::min(rows_, n - at);
    ids.assign(tokens.begin() + at, tokens.begin() + at + t);
    int64_t pos = start_pos + at;
    auto tok = executorch::extension::from_blob(ids.data(), {1, int32_t(t)}, ScalarType::Long);
    auto input_pos = executorch::extension::from_blob(&pos, {1}, ScalarType::Long);
    const std::vector<EValue> args = {EValue(*tok), EValue(*input_pos)};
    copy_floats(program_.run(forward_method_, args).at(0), size_t(t * vocab_), logits,
                size_t(at * vocab_), forward_method_ + "'s logits");
    copy_floats(program_.run(features_method_, args).at(0), size_t(t * features_), features,
                size_t(at * features_), features_method_ + "'s features");
  }
  length_ = end;
}

void ExecuTorchTarget::rollback(int64_t pos) {
  if (pos < 0 || pos > length_)
    throw Error("cannot roll back to " + std::to_string(pos) + ": the cache holds " +
                std::to_string(length_) + " positions");
  length_ = pos;
}

// ----------------------------------------------------------------------- drafter

ExecuTorchDrafter::ExecuTorchDrafter(Program& program)
    : program_(program),
      step_method_(program.manifest().role("drafter_step").method),
      commit_method_(program.manifest().role("drafter_commit").method),
      vocab_(program.manifest().vocab_size),
      features_(program.manifest().feature_size),
      block_(program.manifest().block_size),
      step_rows_(program.manifest().role("drafter_step").rows),
      commit_rows_(program.manifest().role("drafter_commit").rows) {
  for (const TensorSpec& s : program.manifest().state) {
    auto it = dtypes().find(s.dtype);
    if (it == dtypes().end())
      throw Error("drafter state " + s.name + " has dtype " + s.dtype +
                  ", which hyflash-run does not handle: " + kReexport);
    size_t count = 1;
    for (int64_t d : s.shape) count *= size_t(d);
    Slot slot;
    slot.bytes.assign(count * it->second.second, 0);
    slot.tensor = executorch::extension::from_blob(slot.bytes.data(), sizes_of(s.shape),
                                                   it->second.first);
    state_.push_back(std::move(slot));
  }
  step_chunk_.resize(size_t(step_rows_ * features_));
  commit_chunk_.resize(size_t(commit_rows_ * features_));
  logits_.resize(size_t((block_ - 1) * vocab_));
}

void ExecuTorchDrafter::reset() {
  for (Slot& s : state_) std::fill(s.bytes.begin(), s.bytes.end(), 0);
  pending_.clear();
  count_ = 0;
}

void ExecuTorchDrafter::commit(const float* features, int64_t rows) {
  pending_.insert(pending_.end(), features, features + rows * features_);
}

int64_t ExecuTorchDrafter::take(int64_t n, std::vector<float>& chunk) {
  const int64_t width = int64_t(chunk.size()) / features_;
  const int64_t k = std::min({n, width, int64_t(pending_.size()) / features_});
  std::fill(chunk.begin(), chunk.end(), 0.0f);
  std::copy(pending_.begin(), pending_.begin() + k * features_, chunk.begin());
  pending_.erase(pending_.begin(), pending_.begin() + k * features_);
  count_ += k;
  return k;
}

void ExecuTorchDrafter::absorb(const std::vector<EValue>& outputs, size_t first) {
  if (outputs.size() != first + state_.size())
    throw Error("drafter method returned " + std::to_string(outputs.size()) + " outputs, "
                "expected " + std::to_string(first + state_.size()) + ": " + kReexport);
  for (size_t i = 0; i < state_.size(); ++i) {
    const executorch::aten::Tensor t = outputs[first + i].toTensor();
    if (t.nbytes() != state_[i].bytes.size())
      throw Error("drafter state output " + std::to_string(i) + " has " +
                  std::to_string(t.nbytes()) + " bytes, the manifest records " +
                  std::to_string(state_[i].bytes.size()) + ": " + kReexport);
    std::memmove(state_[i].bytes.data(), t.const_data_ptr(), t.nbytes());
  }
}

const std::vector<float>& ExecuTorchDrafter::draft(int64_t anchor, int64_t pos) {
  const int64_t held = count_ + int64_t(pending_.size()) / features_;
  if (pos != held)
    throw Error("draft at position " + std::to_string(pos) + " but the drafter holds " +
                std::to_string(held) + " context features: the engine and drafter are out of "
                "step");
  auto tensor = [](std::vector<float>& rows, int64_t n, int64_t f) {
    return executorch::extension::from_blob(rows.data(), {int32_t(n), int32_t(f)});
  };
  // rows beyond one step's go through the commit-only method first
  while (int64_t(pending_.size()) / features_ > step_rows_) {
    int64_t valid = take(int64_t(pending_.size()) / features_ - step_rows_, commit_chunk_);
    auto chunk = tensor(commit_chunk_, commit_rows_, features_);
    auto n_valid = executorch::extension::from_blob(&valid, {1}, ScalarType::Long);
    std::vector<EValue> args = {EValue(*chunk), EValue(*n_valid)};
    for (Slot& s : state_) args.emplace_back(*s.tensor);
    absorb(program_.run(commit_method_, args), 0);
  }
  int64_t valid = take(step_rows_, step_chunk_);
  auto chunk = tensor(step_chunk_, step_rows_, features_);
  auto n_valid = executorch::extension::from_blob(&valid, {1}, ScalarType::Long);
  auto anchor_t = executorch::extension::from_blob(&anchor, {1}, ScalarType::Long);
  std::vector<EValue> args = {EValue(*anchor_t), EValue(*chunk), EValue(*n_valid)};
  for (Slot& s : state_) args.emplace_back(*s.tensor);
  std::vector<EValue> out = program_.run(step_method_, args);
  copy_floats(out.at(0), logits_.size(), logits_, 0, step_method_ + "'s logits");
  absorb(out, 1);
  return logits_;
}

}  // namespace hyflash
