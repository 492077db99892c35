"""The phone-speed projection: the roofline reproduces its calibration points within the
error it reports, its weight model reproduces the published .pte sizes, and speculative
decoding's projection follows tau, with the full-context drafter slowing as context grows."""

from dataclasses import replace

import pytest

from hyflash.budget import roofline
from hyflash.budget.memory import Plan
from hyflash.budget.recipes import recipe
from hyflash.budget.runtime_costs import runtime_costs
from hyflash.budget.shapes import DrafterShape
from hyflash.budget.sources import resolve


@pytest.fixture(scope="module")
def cal():
    return roofline.calibration()


def test_the_roofline_reproduces_its_calibration_points_within_the_reported_error(cal):
    assert len(cal.points) >= 3
    assert 0.3 < cal.efficiency < 1
    for p in cal.points:
        assert abs(p["projected_tok_s"] / p["decode_tok_s"] - 1) <= cal.error + 1e-12
    assert cal.error < 0.15  # one efficiency explains every point this well, or it is no model


def test_the_weight_model_reproduces_the_published_pte_sizes(cal):
    for p in cal.points:
        assert abs(p["modelled_file_mib"] / p["pte_mib"] - 1) < 0.01, p


def plan(context=2048, quant="8da4w"):
    t = resolve("llama-3.2-1b").target
    return Plan(t, DrafterShape.default_for(t, "hyflash"), recipe(quant, "executorch"), context,
                64, runtime_costs("executorch"))


def test_plain_decode_is_bandwidth_over_bytes_and_speculative_follows_tau(cal):
    p = plan()
    proj = roofline.project(p, 51.2, "phone", cal, tau=3.0)
    rate = 51.2e9 * cal.efficiency
    assert proj.plain_tok_s == pytest.approx(rate / roofline.target_call(p, 1, 2048))
    round_s = (roofline.target_call(p, 8, 2048) + roofline.drafter_call(p, p.drafter, 2048)) / rate
    assert proj.spec_tok_s == pytest.approx(3.0 / round_s)
    assert roofline.project(p, 51.2, "phone", cal, tau=None).spec_tok_s is None


def test_the_hyflash_draft_costs_the_same_at_any_context_and_the_full_one_grows(cal):
    short, long = (roofline.project(plan(c), 51.2, "phone", cal, tau=3.0) for c in (1024, 8192))
    assert short.ms_draft == pytest.approx(long.ms_draft)
    assert long.ms_draft_full > short.ms_draft_full > short.ms_draft
    assert long.full_tok_s < long.spec_tok_s


def test_a_verify_reads_the_weights_once_so_it_costs_about_one_decode():
    p = plan()
    assert roofline.target_call(p, 8, 2048) / roofline.target_call(p, 1, 2048) < 1.05


def test_quantized_weights_project_faster_than_float(cal):
    fast = roofline.project(plan(quant="8da4w"), 51.2, "phone", cal, None).plain_tok_s
    slow = roofline.project(replace(plan(), recipe=recipe("fp32", "executorch")), 51.2,
                            "phone", cal, None).plain_tok_s
    assert fast > 3 * slow


def test_executorch_phone_factors_reproduce_the_published_rss_within_their_error():
    from hyflash.budget.phone_fit import fit, on_phone

    fitted = fit()
    assert set(fitted) == {"float", "quantized"}
    for group in fitted.values():
        assert group["error"] < 0.15
        for p in group["points"]:
            assert abs(p["modelled_rss_mib"] / p["rss_mib"] - 1) <= group["error"] + 1e-12
    desktop = runtime_costs("executorch")
    phone = on_phone(desktop)
    assert phone.weights_factor["8da4w"] == fitted["quantized"]["factor"]
    assert phone.weights_factor["8da4w"] != desktop.weights_factor["8da4w"]
    assert on_phone(runtime_costs("onnx")) == runtime_costs("onnx")  # no phone data: as measured
