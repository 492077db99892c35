// The speculative loop of hyflash/runtime/engine.py in C++ (greedy): prefill -> draft ->
// verify -> accept -> commit -> roll back. Committed tokens are x_0 .. x_{n-1}; the target
// holds KV for all but the last one and the drafter holds the features of exactly those.
// One round drafts d_1..d_r from the anchor x_{n-1} at pos = n-1, verifies
// [anchor, d_1..d_r] in ONE target pass, keeps the longest prefix that equals the target's
// argmax plus the target's own next token (the bonus), commits the features of the anchor
// and the accepted drafts (a rejected draft's are dropped, so the drafter state never rolls
// back) and moves the target's write position back to pos + k + 1. The output equals the
// target's own greedy decode for any drafter. Without a drafter r is 0: plain decoding.
// With a ContextLookup a round copies its drafts from the context where the last tokens
// occurred before (the drafter elsewhere); with a RateGate each round takes whichever of
// the lookup, the drafter and a plain decode has paid most (engine.py does the same); with
// a RowPolicy a drafter round proposes only the leading rows it keeps (draft_rows.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "draft_rows.h"
#include "gate.h"
#include "lookup.h"
#include "stats.h"

namespace hyflash {

// A target model: writes its KV cache at start_pos and returns, row-major, the logits
// [T, V] and the tap features [T, F] of the T tokens.
class TargetBackend {
 public:
  virtual ~TargetBackend() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t feature_size() const = 0;
  virtual int64_t max_seq_len() const = 0;
  virtual void reset() = 0;
  virtual void forward(const std::vector<int64_t>& tokens, int64_t start_pos,
                       std::vector<float>& logits, std::vector<float>& features) = 0;
  virtual void rollback(int64_t pos) = 0;  // positions >= pos are dead
};

// A drafter that owns its window / memory state: commit absorbs verified features; draft
// returns logits [B-1, V] for the positions after the anchor at pos.
class DrafterBackend {
 public:
  virtual ~DrafterBackend() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t feature_size() const = 0;
  virtual int64_t block_size() const = 0;
  virtual void reset() = 0;
  virtual void commit(const float* features, int64_t rows) = 0;
  virtual const std::vector<float>& draft(int64_t anchor, int64_t pos) = 0;
};

struct Generation {
  std::vector<int64_t> prompt;
  std::vector<int64_t> tokens;  // the new tokens, stop token included
  Stats stats;
};

class Engine {
 public:
  // drafter, lookup, gate and rows may be null (neither drafter nor lookup: plain
  // decoding; no rows policy: every drafted row is proposed). Throws Error if the pair
  // does not fit or the lookup's block is not the drafter's.
  Engine(TargetBackend& target, DrafterBackend* drafter, ContextLookup* lookup = nullptr,
         RateGate* gate = nullptr, RowPolicy* rows = nullptr);

  int64_t block_size() const {
    return drafter_ ? drafter_->block_size() : lookup_ ? lookup_->block_size() : 1;
  }

  // Greedy generation of up to max_new_tokens; stops after a token in eos_ids or when the
  // context is full. on_token (optional) sees each token as it commits. The prompt is
  // checked before anything runs (one-line Error).
  Generation generate(const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                      const std::vector<int64_t>& eos_ids,
                      const std::function<void(int64_t)>& on_token = nullptr);

 private:
  void check_prompt(const std::vector<int64_t>& prompt, int64_t max_new_tokens) const;

  TargetBackend& target_;
  DrafterBackend* drafter_;
  ContextLookup* lookup_;
  RateGate* gate_;
  RowPolicy* rows_;
  std::vector<float> logits_, features_;
};

// Index of the first maximum of row[0..n) (torch.argmax's tie rule).
int64_t argmax(const float* row, int64_t n);

// How many leading rows of x [rows, n] are a distribution: no NaN, no +inf, something
// above -inf (hyflash/runtime/sampling.py distribution_rows). Later rows propose nothing.
int64_t distribution_rows(const float* x, int64_t rows, int64_t n);

}  // namespace hyflash
