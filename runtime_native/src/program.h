// The bundle's one ExecuTorch program (.pte) through executorch::extension::Module, and
// the engine's two backends over its methods (hyflash/runtime/executorch_backend.py):
//
// - ExecuTorchTarget: `forward(tokens [1,T], input_pos [1]) -> logits [1,T,V]` (the stock
//   runner's method, which also writes the positions' tap features into a ring inside the
//   program), then `features` (same inputs -> [1,T,F], read from that ring). A call of more
//   tokens than the ring's rows (a long prompt) goes in chunks. The KV cache is mutable
//   buffers inside the program: a rollback only moves the valid length back.
// - ExecuTorchDrafter: `draft` (commit + draft) and `commit` (commit only), every window and
//   memory tensor an explicit input and output of fixed shape, owned here as plain buffers.
//
// The program is exported with share_mutable_buffers (KV cache and ring placed once for all
// methods), so Module is created with share_memory_arenas: methods then share activation
// memory too, and every output is copied out before the next method runs.
#pragma once

#include <executorch/extension/module/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "manifest.h"

namespace hyflash {

class Program {
 public:
  // Loads and checks the program: its format, constant methods and every method's I/O
  // against the manifest. threads > 0 sizes XNNPACK's (process-wide) thread pool.
  Program(Manifest manifest, int threads);

  const Manifest& manifest() const { return manifest_; }
  // Runs a method; a failure is an Error naming the method and ExecuTorch's last message.
  std::vector<executorch::runtime::EValue> run(const std::string& method,
                                               const std::vector<executorch::runtime::EValue>&
                                                   inputs);
  int64_t constant(const std::string& method);  // an int constant method's value

 private:
  void check_io(const MethodContract& c);
  [[noreturn]] void mismatch(const std::string& what) const;

  Manifest manifest_;
  std::string path_;
  std::unique_ptr<executorch::extension::Module> module_;
};

class ExecuTorchTarget : public TargetBackend {
 public:
  explicit ExecuTorchTarget(Program& program);
  int64_t vocab_size() const override { return vocab_; }
  int64_t feature_size() const override { return features_; }
  int64_t max_seq_len() const override { return max_seq_len_; }
  void reset() override { length_ = 0; }
  void forward(const std::vector<int64_t>& tokens, int64_t start_pos,
               std::vector<float>& logits, std::vector<float>& features) override;
  void rollback(int64_t pos) override;

 private:
  Program& program_;
  std::string forward_method_, features_method_;
  int64_t vocab_, features_, max_seq_len_, rows_, length_ = 0;
};

class ExecuTorchDrafter : public DrafterBackend {
 public:
  explicit ExecuTorchDrafter(Program& program);
  int64_t vocab_size() const override { return vocab_; }
  int64_t feature_size() const override { return features_; }
  int64_t block_size() const override { return block_; }
  void reset() override;
  void commit(const float* features, int64_t rows) override;
  const std::vector<float>& draft(int64_t anchor, int64_t pos) override;

 private:
  struct Slot {  // one state tensor: its bytes and a tensor viewing them
    std::vector<uint8_t> bytes;
    std::shared_ptr<executorch::aten::Tensor> tensor;
  };
  // Moves up to n pending rows into chunk (zero-padded to its rows); -> rows moved.
  int64_t take(int64_t n, std::vector<float>& chunk);
  void absorb(const std::vector<executorch::runtime::EValue>& outputs, size_t first);

  Program& program_;
  std::string step_method_, commit_method_;
  int64_t vocab_, features_, block_, step_rows_, commit_rows_;
  std::vector<Slot> state_;
  std::vector<float> pending_;  // verified feature rows not yet absorbed
  int64_t count_ = 0;           // rows absorbed into the state
  std::vector<float> step_chunk_, commit_chunk_, logits_;
};

}  // namespace hyflash
