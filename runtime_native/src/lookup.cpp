#include "lookup.h"

#include <string>

#include "error.h"

namespace hyflash {

ContextLookup::ContextLookup(int64_t max_ngram, int64_t min_ngram, int64_t block_size)
    : max_ngram_(max_ngram), min_ngram_(min_ngram), block_size_(block_size) {
  if (min_ngram < 1 || min_ngram > max_ngram)
    throw Error("lookup n-gram sizes must satisfy 1 <= min (" + std::to_string(min_ngram) +
                ") <= max (" + std::to_string(max_ngram) + ")");
  if (block_size < 2)
    throw Error("lookup block size " + std::to_string(block_size) +
                " < 2: a block is the anchor plus at least one drafted token");
  reset({});
}

size_t ContextLookup::Hash::operator()(const std::vector<int64_t>& v) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
  for (int64_t t : v) h = (h ^ uint64_t(t)) * 1099511628211ull;
  return size_t(h);
}

void ContextLookup::reset(const std::vector<int64_t>& tokens) {
  tokens_.clear();
  seen_.assign(size_t(max_ngram_ - min_ngram_ + 1), Table());
  extend(tokens);
}

void ContextLookup::extend(const std::vector<int64_t>& tokens) {
  for (int64_t t : tokens) {
    const int64_t end = int64_t(tokens_.size()) - 1;  // n-grams ending here get successor t
    for (int64_t n = min_ngram_; n <= max_ngram_; ++n)
      if (end - n + 1 >= 0)
        seen_[size_t(n - min_ngram_)][std::vector<int64_t>(tokens_.begin() + (end - n + 1),
                                                           tokens_.begin() + end + 1)] = end;
    tokens_.push_back(t);
  }
}

std::vector<int64_t> ContextLookup::propose(int64_t r) const {
  const int64_t last = int64_t(tokens_.size()) - 1;
  for (int64_t n = max_ngram_; n >= min_ngram_; --n) {
    if (last - n + 1 < 0) continue;
    const Table& table = seen_[size_t(n - min_ngram_)];
    auto hit = table.find(std::vector<int64_t>(tokens_.begin() + (last - n + 1), tokens_.end()));
    if (hit == table.end()) continue;
    std::vector<int64_t> out;
    for (int64_t i = hit->second + 1; i <= hit->second + r; ++i)
      out.push_back(i <= last ? tokens_[size_t(i)] : out[size_t(i - last - 1)]);
    return out;
  }
  return {};
}

}  // namespace hyflash
