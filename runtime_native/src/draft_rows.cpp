#include "draft_rows.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "error.h"

namespace hyflash {

std::vector<double> confidences(const float* logits, int64_t rows, int64_t n) {
  std::vector<double> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * n;
    double top = row[0];
    bool nan = false;
    for (int64_t i = 0; i < n; ++i) {
      nan = nan || std::isnan(row[i]);
      top = std::max(top, double(row[i]));
    }
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(row[i]) - top);  // inf-inf: NaN
    out[size_t(r)] = nan ? std::nan("") : 1.0 / sum;
  }
  return out;
}

namespace {

int64_t leading_valid(const std::vector<double>& conf, double p) {
  int64_t k = 0;
  while (k < int64_t(conf.size()) && conf[size_t(k)] >= p) ++k;  // NaN >= p is false
  return k;
}

}  // namespace

Cutoff::Cutoff(double p) : p_(p) {
  if (!(p >= 0 && p < 1))
    throw Error("draft cutoff " + std::to_string(p) + ": need 0 <= p < 1 (a probability)");
}

int64_t Cutoff::choose(const std::vector<double>& conf) { return leading_valid(conf, p_); }

ExpectedRate::ExpectedRate(double keep, int64_t explore, int64_t explore_every,
                           double calibration_keep)
    : keep_(keep), calibration_keep_(calibration_keep), explore_(explore),
      explore_every_(explore_every) {
  if (!(keep > 0 && keep < 1 && calibration_keep > 0 && calibration_keep < 1) ||
      explore < 0 || explore_every < 2)
    throw Error("ExpectedRate: need 0 < keep, calibration_keep < 1, explore >= 0, "
                "explore_every >= 2");
  for (int b = 0; b < kBins; ++b) {  // one pseudo-row accepted at the bin's centre
    reached_[size_t(b)] = 1.0;
    accepted_[size_t(b)] = (b + 0.5) / kBins;
  }
}

int ExpectedRate::bin(double c) {
  return std::min(kBins - 1, std::max(0, int(c * kBins)));
}

void ExpectedRate::record_verify(int64_t tokens, double seconds) {
  auto& acc = verify_[tokens];
  acc[0] = keep_ * acc[0] + seconds;
  acc[1] = keep_ * acc[1] + 1.0;
}

void ExpectedRate::record_overhead(double seconds) {
  overhead_[0] = keep_ * overhead_[0] + seconds;
  overhead_[1] = keep_ * overhead_[1] + 1.0;
}

void ExpectedRate::record_accepted(int64_t accepted) {
  for (int64_t i = 0; i < int64_t(last_.size()) && i <= accepted; ++i) {
    const int b = bin(last_[size_t(i)]);
    reached_[size_t(b)] = calibration_keep_ * reached_[size_t(b)] + 1.0;
    accepted_[size_t(b)] = calibration_keep_ * accepted_[size_t(b)] + (i < accepted ? 1.0 : 0.0);
  }
  last_.clear();
}

double ExpectedRate::verify_cost(int64_t tokens) const {
  if (verify_.empty()) return -1;
  auto cost = [](const std::array<double, 2>& a) { return a[0] / a[1]; };
  auto above = verify_.lower_bound(tokens);
  if (above != verify_.end() && above->first == tokens) return cost(above->second);
  if (above == verify_.begin()) return cost(above->second);    // none below: nearest above
  auto below = std::prev(above);
  if (above == verify_.end()) return cost(below->second);      // none above: nearest below
  const double a = cost(below->second), b = cost(above->second);
  return a + (b - a) * double(tokens - below->first) / double(above->first - below->first);
}

int64_t ExpectedRate::best(const std::vector<double>& conf, int64_t rows) const {
  const double t_round = overhead_[1] > 0 ? overhead_[0] / overhead_[1] : 0.0;
  int64_t best_k = rows;
  double best_rate = -1, gain = 1, product = 1;
  for (int64_t k = 0; k <= rows; ++k) {
    if (k > 0) {
      const int b = bin(conf[size_t(k - 1)]);
      product *= accepted_[size_t(b)] / reached_[size_t(b)];
      gain += product;
    }
    const double cost = verify_cost(k + 1);
    if (cost < 0) return rows;
    const double rate = t_round + cost > 0 ? gain / (t_round + cost) : gain;
    if (rate > best_rate) best_k = k, best_rate = rate;
  }
  return best_k;
}

int64_t ExpectedRate::choose(const std::vector<double>& conf) {
  int64_t rows = 0;
  while (rows < int64_t(conf.size()) && !std::isnan(conf[size_t(rows)])) ++rows;
  if (rows == 0) return 0;
  rounds_ += 1;
  int64_t k;
  if (rounds_ <= explore_) {
    const int64_t cycle[3] = {rows, rows / 2, 0};  // measure a few lengths first
    k = cycle[(rounds_ - 1) % 3];
  } else if (rounds_ % explore_every_ == 0) {
    k = rows;  // every row now and then: calibrates confidences it would otherwise cut
  } else {
    k = best(conf, rows);
  }
  last_.assign(conf.begin(), conf.begin() + k);
  return k;
}

}  // namespace hyflash
