#include "gate.h"

#include <algorithm>
#include <limits>
#include <string>

#include "error.h"

namespace hyflash {

RateGate::RateGate(int64_t warmup, int64_t explore_every, double keep)
    : warmup_(warmup), explore_every_(explore_every), keep_(keep) {
  if (warmup < 1 || explore_every < 2 || !(keep > 0 && keep < 1))
    throw Error("RateGate(warmup=" + std::to_string(warmup) + ", explore_every=" +
                std::to_string(explore_every) + ", keep=" + std::to_string(keep) +
                "): need warmup >= 1, explore_every >= 2, 0 < keep < 1");
}

double RateGate::Rate::per_second() const {
  return seconds > 0 ? tokens / seconds : std::numeric_limits<double>::infinity();
}

Proposer RateGate::choose(const std::vector<Proposer>& available) {
  if (available.empty()) throw Error("no proposer available");
  ++decisions_;
  for (Proposer p : available)
    if (rates_[size_t(p)].rounds < warmup_) return p;
  std::vector<Proposer> ranked = available;  // highest rate first, ties in Proposer order
  std::stable_sort(ranked.begin(), ranked.end(), [&](Proposer a, Proposer b) {
    return rates_[size_t(a)].per_second() > rates_[size_t(b)].per_second();
  });
  if (ranked.size() > 1 && decisions_ % explore_every_ == 0) return ranked[1];
  return ranked[0];
}

void RateGate::record(Proposer p, int64_t tokens, double seconds) {
  Rate& r = rates_[size_t(p)];
  r.tokens = keep_ * r.tokens + double(tokens);
  r.seconds = keep_ * r.seconds + seconds;
  r.rounds += 1;
}

}  // namespace hyflash
