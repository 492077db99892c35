// Context lookup (hyflash/runtime/lookup.py in C++): drafts copied from the context. For
// each n-gram size it keeps the end of the latest occurrence of every n-gram that has a
// successor, updated as tokens commit, so a proposal is one hash lookup per size whatever
// the context length. The engine verifies a copy like any other draft: the output stays
// the target's own greedy decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace hyflash {

class ContextLookup {
 public:
  // Throws Error unless 1 <= min_ngram <= max_ngram and block_size >= 2.
  ContextLookup(int64_t max_ngram = 3, int64_t min_ngram = 1, int64_t block_size = 8);

  int64_t block_size() const { return block_size_; }
  void reset(const std::vector<int64_t>& tokens);
  void extend(const std::vector<int64_t>& tokens);  // commit tokens in order
  // r tokens copied from after the latest earlier occurrence of the longest suffix found
  // (max_ngram down to min_ngram), or none. A copy that runs into the end of the context
  // continues through its own tokens: a text with period P goes on with period P.
  std::vector<int64_t> propose(int64_t r) const;

 private:
  struct Hash {
    size_t operator()(const std::vector<int64_t>& v) const;
  };
  using Table = std::unordered_map<std::vector<int64_t>, int64_t, Hash>;

  int64_t max_ngram_, min_ngram_, block_size_;
  std::vector<int64_t> tokens_;
  std::vector<Table> seen_;  // seen_[n - min_ngram]: n-gram -> index of its last token
};

}  // namespace hyflash
