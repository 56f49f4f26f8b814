"""Hardware profiles and the device/link cost primitives.

Oracles: published.json figures (datasheets, nccl-tests measurements, DeepSeek-V3),
the roofline written out by hand, and properties (monotonicity) -- never the code's
own output fed back to itself.
"""
from __future__ import annotations

from dataclasses import replace
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.cluster import hardware
from parsim.cluster.hardware import (
    Device,
    HardwareProfile,
    LinkTier,
    dumps_profile,
    list_profiles,
    load_profile,
    parse_profile,
)
from parsim.errors import ConfigError

PUBLISHED_PATH = Path(__file__).resolve().parent / "data" / "published.json"
BUNDLED = ["cpu-gloo", "dgx-a100-80g", "dgx-a100-40g", "dgx-h100", "dgx-h200", "dgx-h800", "hgx-b200", "dgx-b200", "dgx-b300",
           "gb200-nvl72", "gb300-nvl72", "aws-p3.16xlarge", "dgx2-v100", "grand-teton-h100"]
GPU_PROFILES = [n for n in BUNDLED if n != "cpu-gloo"]
GB = 1e9
GiB = 2.0**30


def pub(id_: str) -> dict:
    if not PUBLISHED_PATH.exists():
        pytest.skip(f"{PUBLISHED_PATH} not present")
    for e in json.loads(PUBLISHED_PATH.read_text()):
        if e["id"] == id_:
            return e
    raise KeyError(id_)


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# ---------------------------------------------------------------- bundled profiles
def test_bundled_profiles_are_listed():
    assert set(BUNDLED) <= set(list_profiles())


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_profile_loads(name):
    hw = load_profile(name)
    assert isinstance(hw, HardwareProfile) and hw.name == name
    assert hw.source_path.endswith(f"{name}.toml")
    assert 0 < hw.device.usable_memory_bytes < hw.device.memory_bytes
    assert hw.gpus_per_leaf % hw.gpus_per_node == 0


@pytest.mark.parametrize("name", BUNDLED)
def test_every_number_has_a_source_comment(name):
    text = (hardware.PROFILE_DIR / f"{name}.toml").read_text()
    for line in text.splitlines():
        m = re.match(r"\s*([a-z0-9_]+)\s*=\s*([-+0-9.eE]+)\s*(#.*)?$", line)
        if m:
            assert m.group(3) and "source:" in m.group(3), f"{name}: {line!r} has no '# source:'"
            if name == "cpu-gloo":
                assert "documented estimate, to be replaced by `parsim calibrate`" in m.group(3)


@pytest.mark.parametrize("profile, entry, tflops", [
    ("dgx-a100-80g", "hw-A100-SXM4-80GB", 312),
    ("dgx-h100", "hw-H100-SXM5-80GB", 989.4),
    ("dgx-h200", "hw-H200-SXM-141GB", 989.4),
    ("dgx-h800", "hw-H800-SXM", 989),
    ("hgx-b200", "hw-B200-HGX", 2250),
])
def test_device_figures_match_published(profile, entry, tflops):
    e = pub(entry)["expected"]
    assert e["bf16_dense_TFLOPs"] == tflops
    dev = load_profile(profile).device
    # H800's entry rounds 989.4 to 989 (MegaScale-MoE table); the rest are exact.
    assert rel(dev.peak("bf16"), e["bf16_dense_TFLOPs"] * 1e12) < 1e-3
    # HBM "GB" on datasheets is (nearly) GiB: A100 80GB = 81920 MiB. The profile holds what
    # torch reports, a little below. B200's entry gives the usable figure in its notes.
    cap = 179 if profile == "hgx-b200" else e["hbm_GB"]
    if profile == "hgx-b200":
        assert "179" in pub(entry)["notes"]
    assert rel(dev.memory_bytes / GiB, cap) < 0.02
    # H800's entry rounds 3.35 TB/s to 3.4.
    assert rel(dev.memory_bandwidth, e["hbm_TBps"] * 1e12) < 0.02


@pytest.mark.parametrize("profile, entry", [
    ("dgx-a100-80g", "hw-A100-SXM4-80GB"), ("dgx-h100", "hw-H100-SXM5-80GB"),
    ("dgx-h200", "hw-H200-SXM-141GB"), ("dgx-h800", "hw-H800-SXM"), ("hgx-b200", "hw-B200-HGX"),
])
def test_nvlink_line_rate_is_half_the_bidirectional_figure(profile, entry):
    bidir = pub(entry)["expected"]["nvlink_total_bidir_GBps"]
    assert load_profile(profile).nvlink.bandwidth == pytest.approx(bidir / 2 * GB)


def test_h800_nvlink_is_400_bidirectional_and_deepseek_effective():
    hw = load_profile("dgx-h800")
    assert 2 * hw.nvlink.bandwidth == pytest.approx(400 * GB)
    ds = pub("deepseek-h800-link-bw")["expected"]
    assert rel(hw.nvlink.effective_bandwidth, ds["nvlink_effective_GBps"] * GB) < 0.10
    assert hw.nic.bandwidth == pytest.approx(ds["ib_effective_GBps"] * GB)  # 400 Gb/s line rate
    # the ratio DeepSeek quotes (3.2) from line rates it uses
    assert hw.nvlink.effective_bandwidth / hw.nic.bandwidth == pytest.approx(ds["ratio"], rel=0.1)


# ---------------------------------------------------------------- links vs nccl-tests
def test_a100_nvlink_reproduces_8gpu_allreduce_busbw():
    # ring all-reduce: t = 2(n-1)/n * S / B  =>  busbw = algbw * 2(n-1)/n = B
    busbw = pub("nccl-a100-allreduce")["expected"]["single_node_8gpu_allreduce_busbw_GBps"]
    hw = load_profile("dgx-a100-80g")
    n, size = 8, 8 * 2**30
    t = 2 * (n - 1) / n * size / hw.nvlink.effective_bandwidth
    model_busbw = size / t * 2 * (n - 1) / n
    assert rel(model_busbw, busbw * GB) < 0.10


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-h200"])
def test_h100_nvlink_reproduces_ring_busbw(profile):
    e = pub("nccl-h100-nvls-allreduce-8gpu")["expected"]
    hw = load_profile(profile)
    assert hw.nvlink.bandwidth == pytest.approx(e["nvlink_line_rate_unidir_GBps"] * GB)
    assert rel(hw.nvlink.effective_bandwidth, e["effective_nvlink_bw_GBps_ring_or_non_allreduce"] * GB) < 0.10
    # NVLS (in-switch reduction) exceeds the wire; a ring model must stay below it
    assert hw.nvlink.effective_bandwidth < e["peak_busbw_GBps"] * GB


def test_a100_two_node_allreduce_matches_nic_figure():
    e = pub("nccl-a100-allreduce")
    # The measurement's nodes had 4 HDR NICs (notes: 4 x 200 Gb/s = 100 GB/s per node).
    assert "4 x 200" in e["notes"]
    hw = load_profile("dgx-a100-80g")
    assert 4 * hw.nic.bandwidth == pytest.approx(e["expected"]["two_node_theoretical_GBps"] * GB)
    assert rel(4 * hw.nic.effective_bandwidth, e["expected"]["two_node_allreduce_busbw_GBps"] * GB) < 0.10
    assert hw.nics_per_node == 8  # the DGX itself has 8 (hw-network-links)


def test_nic_line_rates_match_published_links():
    links = pub("hw-network-links")["expected"]
    assert load_profile("dgx-a100-80g").nic.bandwidth * 8 == pytest.approx(links["HDR_Gbps"] * GB)
    for name in ("dgx-h100", "dgx-h200", "dgx-h800", "hgx-b200"):
        assert load_profile(name).nic.bandwidth * 8 == pytest.approx(links["NDR_Gbps"] * GB)
    assert 2 * load_profile("hgx-b200").nvlink.bandwidth == pytest.approx(links["NVLink5_GBps_bidir"] * GB)


def test_link_transfer_time_is_alpha_beta():
    link = LinkTier("nic", bandwidth=25e9, latency_s=5e-6, efficiency=0.8)
    assert link.effective_bandwidth == pytest.approx(20e9)
    assert link.transfer_time(0) == pytest.approx(5e-6)
    assert link.transfer_time(20e9) == pytest.approx(1 + 5e-6)


def test_link_between_uses_node_boundaries():
    hw = load_profile("dgx-h100")
    assert hw.node_of(7) == 0 and hw.node_of(8) == 1
    assert hw.link_between(0, 7) is hw.nvlink
    assert hw.link_between(7, 8) is hw.nic
    assert hw.link_between(3, 3) is hw.nvlink
    assert not hw.crosses_spine(0, hw.gpus_per_leaf - 1)
    assert hw.crosses_spine(0, hw.gpus_per_leaf)


# ---------------------------------------------------------------- compute model
@pytest.mark.parametrize("name", BUNDLED)
def test_large_gemm_approaches_peak_times_efficiency(name):
    # the two-knob shape model (device.gemm_model = "shape": what parsim calibrate fits)
    dev = replace(load_profile(name).device, gemm_model="shape")
    p = _base(dev)
    d = 32768
    achieved = 2 * d**3 / dev.gemm_time(d, d, d, p)
    assert rel(achieved, dev.peak(p) * dev.gemm_efficiency) < 0.02


@pytest.mark.parametrize("name", BUNDLED)
def test_skinny_gemm_is_memory_bound(name):
    dev = load_profile(name).device
    p = _base(dev)
    n = k = 8192
    roofline = (1 * k + k * n + 1 * n) * 2 / (dev.memory_bandwidth * dev.memory_efficiency)
    lat = dev.kernels.gemm_latency_s if dev.kernels is not None else 0.0  # the kernel's fixed time
    assert dev.gemm_time(1, n, k, p) == pytest.approx(roofline + lat, rel=1e-12)
    # three in one batched launch: three times the bytes, the launch's fixed time once
    assert dev.gemm_time(1, n, k, p, count=3) == pytest.approx(3 * roofline + lat, rel=1e-12)


def test_gemm_edge_cases():
    dev = load_profile("dgx-h100").device
    assert dev.gemm_time(0, 10, 10) == 0.0
    assert dev.gemm_time(10, 10, 10, count=0) == 0.0
    with pytest.raises(ValueError):
        dev.gemm_time(-1, 10, 10)
    # fp8 doubles the dense rate of a compute-bound GEMM in the shape model; the kernel model
    # follows the measured MAMF instead (H100: 1402.6 fp8 vs 794.5 bf16 TFLOP/s, 1.77x)
    shape = replace(dev, gemm_model="shape")
    assert shape.gemm_time(16384, 16384, 16384, "fp8") == pytest.approx(
        shape.gemm_time(16384, 16384, 16384, "bf16") / 2, rel=1e-3)
    ratio = dev.gemm_time(16384, 16384, 16384, "bf16") / dev.gemm_time(16384, 16384, 16384, "fp8")
    assert ratio == pytest.approx(1402.6 / 794.5, rel=0.05)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(BUNDLED), m=st.integers(1, 65536), n=st.integers(1, 65536),
       k=st.integers(1, 65536), which=st.sampled_from("mnk"), step=st.integers(1, 4096))
def test_gemm_time_is_monotone_in_each_dim(name, m, n, k, which, step):
    dev = _devices()[name]
    p = _base(dev)
    base = dev.gemm_time(m, n, k, p)
    bigger = {"m": (m + step, n, k), "n": (m, n + step, k), "k": (m, n, k + step)}[which]
    assert dev.gemm_time(*bigger, p) >= base


_DEV_CACHE: dict[str, Device] = {}


def _base(dev: Device) -> str:
    """The 16-bit precision the device has tensor cores for (V100: fp16 only)."""
    return "bf16" if "bf16" in dev.peak_flops else "fp16"


def _devices() -> dict[str, Device]:
    if not _DEV_CACHE:
        _DEV_CACHE.update({n: load_profile(n).device for n in BUNDLED})
    return _DEV_CACHE


def test_memory_and_attention_time():
    dev = load_profile("dgx-a100-80g").device
    assert dev.memory_time(1e9) == pytest.approx(1e9 / (2.039e12 * dev.memory_efficiency))
    assert dev.attention_time(1e12) == pytest.approx(1e12 / (312e12 * dev.attention_efficiency))


def test_peak_precisions():
    dev = load_profile("dgx-h100").device
    assert dev.peak("bfloat16") == dev.peak("bf16") == pytest.approx(989.4e12)
    with pytest.raises(ValueError, match="known: bf16"):
        dev.peak("int4")
    with pytest.raises(ValueError, match="known:"):
        load_profile("dgx-a100-80g").device.peak("fp8")  # A100 has no fp8
    cpu = load_profile("cpu-gloo").device
    assert cpu.peak("bf16") == cpu.peak("fp32")  # stated: bf16 treated as fp32 speed


# ---------------------------------------------------------------- strictness
def _variant(tmp_path: Path, edit) -> Path:
    text = (hardware.PROFILE_DIR / "dgx-h100.toml").read_text()
    path = tmp_path / "custom.toml"
    path.write_text(edit(text))
    return path


def _raises(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_profile(str(path))
    return info.value


def test_unknown_key_names_file_and_dotted_key(tmp_path):
    path = _variant(tmp_path, lambda t: t.replace("[device]\n", "[device]\nfoo = 1\n"))
    err = _raises(path)
    assert "custom.toml" in str(err) and "device.foo" in str(err) and "unknown key" in str(err)
    assert "bf16_tflops" in str(err)  # lists the known keys


def test_unknown_table(tmp_path):
    err = _raises(_variant(tmp_path, lambda t: t + "\n[gpu]\nx = 1\n"))
    assert "custom.toml" in str(err) and "gpu" in str(err) and "unknown key" in str(err)


def test_missing_key(tmp_path):
    err = _raises(_variant(tmp_path, lambda t: re.sub(r"(?m)^nvlink_efficiency.*\n", "", t)))
    assert "custom.toml" in str(err) and "node.nvlink_efficiency" in str(err) and "missing" in str(err)


def test_negative_number(tmp_path):
    err = _raises(_variant(tmp_path, lambda t: t.replace("nic_latency_us = 4.0", "nic_latency_us = -4.0")))
    assert "custom.toml" in str(err) and "network.nic_latency_us" in str(err)


@pytest.mark.parametrize("old, new, key", [
    ("bf16_tflops = 989.4", 'bf16_tflops = "fast"', "device.bf16_tflops"),
    ("gpus_per_node = 8", "gpus_per_node = 8.5", "node.gpus_per_node"),
    ("gemm_efficiency = 0.83", "gemm_efficiency = 1.3", "device.gemm_efficiency"),
    ("spine_oversubscription = 1.0", "spine_oversubscription = 0.5", "network.spine_oversubscription"),
    ("memory_gib = 79.11", "memory_gib = 0", "device.memory_gib"),
    ("nics_per_node = 8", "nics_per_node = true", "network.nics_per_node"),
    ("gpus_per_leaf = 256", "gpus_per_leaf = 12", "network.gpus_per_leaf"),
])
def test_bad_values_name_the_key(tmp_path, old, new, key):
    err = _raises(_variant(tmp_path, lambda t: t.replace(old, new)))
    assert key in str(err) and "custom.toml" in str(err)


def test_unknown_profile_lists_known():
    with pytest.raises(ConfigError) as info:
        load_profile("dgx-z9000", source="scenarios/x.toml")
    msg = str(info.value)
    assert msg.startswith("scenarios/x.toml: hardware: no profile 'dgx-z9000'")
    for name in BUNDLED:
        assert name in msg


def test_invalid_toml(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("name = \n")
    assert "broken.toml" in str(_raises(path))


# ---------------------------------------------------------------- paths, calibrated, writing
def test_relative_path_resolves_against_base_dir(tmp_path):
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "mine.toml").write_text((hardware.PROFILE_DIR / "dgx-h100.toml").read_text())
    assert load_profile("hw/mine.toml", base_dir=tmp_path).name == "dgx-h100"


def test_calibrated_dir_is_searched(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "CALIBRATED_DIR", tmp_path)
    text = (hardware.PROFILE_DIR / "cpu-gloo.toml").read_text().replace('name = "cpu-gloo"', 'name = "my-box"')
    (tmp_path / "my-box.toml").write_text(text)
    assert load_profile("my-box").name == "my-box"
    assert "my-box" in list_profiles()
    assert load_profile("cpu-gloo").source_path.endswith("profiles/cpu-gloo.toml")  # bundled wins


def test_dumps_profile_round_trips(tmp_path):
    hw = load_profile("dgx-a100-80g")
    text = dumps_profile(hw, sources={"device.gemm_efficiency": "calibrated: 12 GEMMs"},
                         calibration={"date": "2025-01-01", "samples": 12})
    assert "gemm_efficiency = 0.88  # source: calibrated: 12 GEMMs" in text
    path = tmp_path / "rt.toml"
    path.write_text(text)
    back = load_profile(str(path))
    assert back.device == hw.device and back.nvlink == hw.nvlink and back.nic == hw.nic
    assert back.gpus_per_leaf == hw.gpus_per_leaf and back.switch_latency_s == pytest.approx(hw.switch_latency_s)


def test_parse_profile_from_mapping_and_hashable():
    import tomllib
    data = tomllib.loads((hardware.PROFILE_DIR / "dgx-h100.toml").read_text())
    hw = parse_profile(data, "inline")
    assert hw.device == load_profile("dgx-h100").device
    assert hash(hw) == hash(parse_profile(data, "inline"))  # usable as a cache key


# ---------------------------------------------------------------- profiles added for the kernel models
def test_h200_is_h100_compute_with_its_own_memory():
    h100, h200 = load_profile("dgx-h100").device, load_profile("dgx-h200").device
    for f in ("peak_flops", "kernels", "gemm_efficiency", "gemm_half_dim", "attention_efficiency",
              "unfused_attention_efficiency", "kernel_launch_s", "gemm_model"):
        assert getattr(h100, f) == getattr(h200, f), f
    e = pub("hw-H200-SXM-141GB")["expected"]
    assert rel(h200.memory_bandwidth, e["hbm_TBps"] * 1e12) < 1e-9
    assert rel(h200.memory_bytes / GiB, e["hbm_GB"]) < 0.02 and h200.memory_bytes > 1.7 * h100.memory_bytes


def test_dgx_b200_is_the_hgx_b200_gpu():
    hgx, dgx = load_profile("hgx-b200"), load_profile("dgx-b200")
    for f in ("peak_flops", "kernels", "memory_bytes", "memory_bandwidth", "gemm_efficiency"):
        assert getattr(hgx.device, f) == getattr(dgx.device, f), f
    assert dgx.gpus_per_node == 8 and dgx.nics_per_node == 8 and dgx.nvlink == hgx.nvlink


@pytest.mark.parametrize("name", ["gb200-nvl72", "gb300-nvl72"])
def test_nvl72_is_one_72_gpu_nvlink_domain(name):
    hw = load_profile(name)
    assert hw.gpus_per_node == 72 and hw.nics_per_node == 72
    bidir = pub("hw-B200-in-GB200")["expected"]["nvlink_total_bidir_GBps"]
    assert 2 * hw.nvlink.bandwidth == pytest.approx(bidir * GB)  # NVLink5, 1.8 TB/s per GPU
    assert hw.link_between(0, 71) is hw.nvlink and hw.link_between(71, 72) is hw.nic
    assert "sustained_fraction" not in (hardware.PROFILE_DIR / f"{name}.toml").read_text()


def test_gb200_gpu_matches_published():
    e = pub("hw-B200-in-GB200")["expected"]
    dev = load_profile("gb200-nvl72").device
    assert dev.peak("bf16") == pytest.approx(e["bf16_dense_TFLOPs"] * 1e12)
    assert dev.peak("fp8") == pytest.approx(2 * e["bf16_dense_TFLOPs"] * 1e12)  # notes: FP8 dense 5000
    assert dev.memory_bandwidth == pytest.approx(e["hbm_TBps"] * 1e12)


@pytest.mark.parametrize("name", ["aws-p3.16xlarge", "dgx2-v100"])
def test_v100_has_fp16_tensor_cores_and_no_bf16(name):
    dev = load_profile(name).device
    assert "bf16" not in dev.peak_flops and dev.peak("fp16") == pytest.approx(125e12)
    with pytest.raises(ValueError, match="known: fp16"):
        dev.peak("bf16")
    assert dev.kernels.attention_kernel is None  # FlashAttention needs sm80+


@pytest.mark.parametrize("name", ["dgx-b200", "gb200-nvl72", "gb300-nvl72", "aws-p3.16xlarge", "dgx2-v100"])
def test_new_profiles_carry_no_fitted_end_to_end_factor(name):
    assert not hasattr(load_profile(name).device, "sustained_fraction")
    assert load_profile(name).device.gemm_model == "kernel"


def test_a_profile_needs_a_16_bit_peak(tmp_path):
    path = tmp_path / "nobf16.toml"
    path.write_text(re.sub(r"(?m)^(bf16|fp16)_tflops.*\n", "",
                           (hardware.PROFILE_DIR / "dgx-h100.toml").read_text()))
    err = _raises(path)
    assert "device.bf16_tflops" in str(err) and "fp16_tflops" in str(err)


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_kernel_facts_round_trip_through_dumps(tmp_path, name):
    hw = load_profile(name)
    path = tmp_path / "rt.toml"
    path.write_text(dumps_profile(hw))
    assert load_profile(str(path)).device == hw.device


# ---------------------------------------------------------------- same die, other memory or power
def test_a100_40gb_is_a100_compute_with_its_own_memory():
    small, big = load_profile("dgx-a100-40g"), load_profile("dgx-a100-80g")
    # NVIDIA A100 datasheet: 40 GB HBM2 at 1,555 GB/s; PyTorch reports 39.59 GiB
    assert small.device.memory_bytes == pytest.approx(39.59 * GiB)
    assert small.device.memory_time(1e9) / big.device.memory_time(1e9) == pytest.approx(2.039 / 1.555)
    # the same GA100 and the same measured MAMF: a compute-bound GEMM takes the same time to
    # 0.5% (the kernel model's pipeline fill reads HBM, so each profile's main-loop rate
    # calibrates to the MAMF a little differently)
    t40, t80 = small.device.gemm_time(8192, 8192, 8192), big.device.gemm_time(8192, 8192, 8192)
    assert t40 == pytest.approx(t80, rel=0.005)
    assert small.nic == big.nic and small.nvlink == big.nvlink and small.nics_per_node == big.nics_per_node


def test_grand_teton_h100_is_rated_between_the_sxm_and_nvl_datasheets():
    gt, sxm = load_profile("grand-teton-h100"), load_profile("dgx-h100")
    # NVIDIA ratings of the same 132-SM die: H100 SXM 989.4 dense BF16 at 700 W, H100 NVL
    # 1,671 sparse = 835.5 dense at 400 W; the 500 W part on the line between them
    sxm_w, nvl_w, sxm_tf, nvl_tf = 700.0, 400.0, 989.4, 1671.0 / 2
    at_500 = nvl_tf + (sxm_tf - nvl_tf) * (500.0 - nvl_w) / (sxm_w - nvl_w)
    assert gt.device.peak("bf16") == pytest.approx(at_500 * 1e12, rel=1e-3)
    # dynamic power ~ f^3 (voltage tracking frequency) gives the same clock within 0.3% and
    # reproduces the NVL rating from the SXM one within 2%: the interpolation is physical
    assert sxm_tf * (500.0 / sxm_w) ** (1 / 3) == pytest.approx(at_500, rel=3e-3)
    assert sxm_tf * (nvl_w / sxm_w) ** (1 / 3) == pytest.approx(nvl_tf, rel=0.02)
    # torchtitan's benchmark hardware: 96 GB HBM2e at 2.4 TB/s
    assert gt.device.memory_time(2.4e12 * gt.device.memory_efficiency) == pytest.approx(1.0)
    # a compute-bound GEMM runs at the 500 W clock: slower by the rated ratio
    ratio = gt.device.gemm_time(8192, 8192, 8192) / sxm.device.gemm_time(8192, 8192, 8192)
    assert ratio == pytest.approx(sxm_tf / at_500, rel=0.01)


def test_b300_profile_is_blackwell_ultra():
    """dgx-b300: B200's dense BF16/FP8 rates, 288 GB, twice the exp2 rate (NVIDIA's Blackwell Ultra
    softmax post; GB300's GPU is the same Blackwell Ultra), its own measured MAMF."""
    b300, b200, gb300 = (load_profile(n).device for n in ("dgx-b300", "dgx-b200", "gb300-nvl72"))
    assert gb300.kernels.sfu_op_per_clock_per_sm == b300.kernels.sfu_op_per_clock_per_sm
    assert b300.peak("bf16") == b200.peak("bf16") and b300.peak("fp8") == b200.peak("fp8")
    assert b300.kernels.sfu_op_per_clock_per_sm == 2 * b200.kernels.sfu_op_per_clock_per_sm
    assert b300.memory_bytes > 1.45 * b200.memory_bytes
    burst = b300.burst()
    m, n, k = 12288, 18432, 1024  # the MAMF table's B300 best shape: 1769.0 TFLOP/s
    assert 2.0 * m * n * k / burst.gemm_time(m, n, k, "bf16") == pytest.approx(1769.0e12, rel=0.05)
