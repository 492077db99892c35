// How many of the drafter's rows a round proposes (hyflash/runtime/draft_rows.py in C++).
// A verify of T tokens costs more the larger T is, and late rows are rarely accepted. A
// policy reads the drafter's confidence in each row (the probability of its most likely
// token) and keeps the leading rows that pay:
// - Cutoff(p): the leading rows whose confidence is at least p;
// - ExpectedRate ("auto"): the k maximising (1 + a_1 + a_1 a_2 + ...) / (t_round +
//   t_verify(k + 1)), a_i how often rows of row i's confidence (bins of 0.1) were accepted
//   when the verify reached them, t_verify per length and the rest of a drafter round
//   measured as it runs; all / half / none of the rows in its first `explore` rounds, all
//   rows every `explore_every`-th round.
// The choice reads only the drafter's logits, so the output stays the target's.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

namespace hyflash {

// Probability of each row's most likely token of logits [rows, n]; NaN for a row that is
// no distribution (it ends every policy's run of kept rows).
std::vector<double> confidences(const float* logits, int64_t rows, int64_t n);

class RowPolicy {
 public:
  virtual ~RowPolicy() = default;
  virtual int64_t choose(const std::vector<double>& conf) = 0;  // rows to propose
  virtual void record_verify(int64_t tokens, double seconds) { (void)tokens, (void)seconds; }
  virtual void record_overhead(double seconds) { (void)seconds; }
  virtual void record_accepted(int64_t accepted) { (void)accepted; }
};

class Cutoff : public RowPolicy {
 public:
  explicit Cutoff(double p);  // throws Error unless 0 <= p < 1
  int64_t choose(const std::vector<double>& conf) override;

 private:
  double p_;
};

class ExpectedRate : public RowPolicy {
 public:
  // Throws Error unless 0 < keep, calibration_keep < 1, explore >= 0, explore_every >= 2.
  ExpectedRate(double keep = 0.9, int64_t explore = 6, int64_t explore_every = 16,
               double calibration_keep = 0.97);
  int64_t choose(const std::vector<double>& conf) override;
  void record_verify(int64_t tokens, double seconds) override;
  void record_overhead(double seconds) override;
  void record_accepted(int64_t accepted) override;
  double verify_cost(int64_t tokens) const;  // estimated seconds; < 0 before any verify

 private:
  static constexpr int kBins = 10;
  static int bin(double c);
  int64_t best(const std::vector<double>& conf, int64_t rows) const;
  double keep_, calibration_keep_;
  int64_t explore_, explore_every_, rounds_ = 0;
  std::map<int64_t, std::array<double, 2>> verify_;  // T -> {weighted seconds, weight}
  std::array<double, 2> overhead_{0, 0};
  std::array<double, kBins> reached_{}, accepted_{};
  std::vector<double> last_;  // confidences of the rows proposed in the last round
};

}  // namespace hyflash
