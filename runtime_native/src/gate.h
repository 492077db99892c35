// The rate gate (hyflash/runtime/gate.py in C++): per round, whichever of the lookup, the
// drafter and a plain one-token decode has committed the most tokens per second so far.
// Per proposer an exponentially weighted sum of the tokens a round committed and of its
// wall time (drafting + verifying); a proposer measured fewer than `warmup` times is tried
// first, and every `explore_every`-th decision takes the runner-up once so a stale estimate
// recovers. It only picks which drafts are proposed: the output stays the target's.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace hyflash {

enum class Proposer { lookup = 0, drafter = 1, plain = 2 };

class RateGate {
 public:
  // Throws Error unless warmup >= 1, explore_every >= 2 and 0 < keep < 1.
  RateGate(int64_t warmup = 4, int64_t explore_every = 16, double keep = 0.9);

  // A new sequence keeps what was learned about the bundle's costs.
  void reset() { decisions_ = 0; }
  // The proposer for this round among those that can run (given in Proposer order).
  Proposer choose(const std::vector<Proposer>& available);
  void record(Proposer p, int64_t tokens, double seconds);

 private:
  struct Rate {
    double tokens = 0, seconds = 0;
    int64_t rounds = 0;
    double per_second() const;
  };
  int64_t warmup_, explore_every_;
  double keep_;
  std::array<Rate, 3> rates_{};
  int64_t decisions_ = 0;
};

}  // namespace hyflash
