"""The kernel registry: one reference per op, device checks, KIMI_KERNELS, shipped defaults."""
import pytest

from engined import ops  # noqa: F401  (registers every variant)
from engined.ops import registry

# The fast variant an ordinary run must get, per device. Changing a default means
# changing this table on purpose (local-kimi once shipped the reference by accident).
SHIPPED = {
    ("w4a16_gemv", "cpu"): "cpu_c",
    ("w4a16_gemm", "cpu"): "cpu_c",
    ("w4a16_gemm", "cuda"): "triton",
    ("w4a16_grouped_gemv", "cpu"): "cpu_c",
    ("w4a8_gemv", "cpu"): "cpu_c",
    ("q8_gemv", "cpu"): "cpu_c",
    ("llama_decode_layer", "cpu"): "cpu_c",
    ("moe_swiglu", "cpu"): "cpu_c",
    ("w4a16_gemv", "cuda"): "triton",
    ("w4a16_grouped_gemv", "cuda"): "triton",
    ("moe_swiglu", "cuda"): "triton",
    ("paged_mla_decode", "cpu"): "cpu_rows",
    ("kda_decode", "cpu"): "cpu_c",
    ("paged_mla_decode", "cuda"): "triton",
    ("kda_decode", "cuda"): "triton",
    ("kda_prefill", "cuda"): "fla",
    ("add_rmsnorm", "cuda"): "triton",
    ("moe_decode", "cuda"): "triton",
    ("moe_decode", "cpu"): "composed",
    ("w4a16_swiglu", "cuda"): "triton",
    ("w4a16_swiglu", "cpu"): "composed",
    ("mla_latent", "cuda"): "triton",
    ("short_conv", "cuda"): "triton",
    ("gated_rmsnorm", "cuda"): "triton",
    ("moe_route", "cuda"): "triton",
    ("moe_grouped", "cuda"): "triton_dot",
    ("moe_grouped", "cpu"): "cpu_c",
}


@pytest.fixture(autouse=True)
def no_env_override(monkeypatch):
    monkeypatch.delenv("KIMI_KERNELS", raising=False)


@pytest.mark.parametrize("op,device", sorted(SHIPPED))
def test_shipped_defaults_are_pinned(op, device):
    assert registry.resolve(op, device).name == SHIPPED[(op, device)]


def test_every_op_has_exactly_one_reference_that_runs_everywhere():
    assert registry.ops(), "no ops registered"
    for op in registry.ops():
        ref = registry.variants(op)[registry.REFERENCE]
        assert {"cpu", "cuda"} <= ref.devices


def test_every_variant_declares_devices():
    for op in registry.ops():
        for variant in registry.variants(op).values():
            assert variant.devices and variant.devices <= {"cpu", "cuda"}, variant


def test_env_overrides_the_default(monkeypatch):
    monkeypatch.setenv("KIMI_KERNELS", " w4a16_gemv = reference , other_op=x")
    assert registry.resolve("w4a16_gemv", "cpu").name == registry.REFERENCE


def test_env_unknown_variant_is_refused(monkeypatch):
    monkeypatch.setenv("KIMI_KERNELS", "w4a16_gemv=nope")
    with pytest.raises(registry.KernelError, match="unknown variant 'nope'"):
        registry.resolve("w4a16_gemv", "cpu")


@pytest.mark.parametrize("text", ["w4a16_gemv", "w4a16_gemv=", "=cpu_c"])
def test_parse_env_refuses_malformed_entries(text):
    with pytest.raises(registry.KernelError, match="not op=variant"):
        registry.parse_env(text)


def test_parse_env_trims_and_skips_empty_items():
    assert registry.parse_env(" a = b ,, c=d ,") == {"a": "b", "c": "d"}
    assert registry.parse_env(None) == {}


def test_using_beats_env_and_restores(monkeypatch):
    monkeypatch.setenv("KIMI_KERNELS", "w4a16_gemv=reference")
    with registry.using("w4a16_gemv", "cpu_c"):
        assert registry.resolve("w4a16_gemv", "cpu").name == "cpu_c"
    assert registry.resolve("w4a16_gemv", "cpu").name == registry.REFERENCE


def test_resolve_refuses_a_variant_on_the_wrong_device():
    with registry.using("w4a16_gemv", "cpu_c"):
        with pytest.raises(registry.KernelError, match="not cuda"):
            registry.resolve("w4a16_gemv", "cuda")


@pytest.mark.parametrize("op", ["w4a16_gemv", "w4a16_grouped_gemv", "moe_swiglu"])
def test_a_cuda_only_variant_is_refused_on_cpu(op, monkeypatch):
    monkeypatch.setenv("KIMI_KERNELS", f"{op}=triton")
    assert registry.variants(op)["triton"].devices == {"cuda"}
    with pytest.raises(registry.KernelError, match="runs on \\['cuda'\\], not cpu"):
        registry.resolve(op, "cpu")


def test_duplicate_registration_and_unknown_op_are_errors():
    with pytest.raises(registry.KernelError, match="registered twice"):
        registry.register("w4a16_gemv", "cpu_c")(lambda *a: None)
    with pytest.raises(registry.KernelError, match="unknown op"):
        registry.resolve("no_such_op")


def test_ops_import_without_numpy_cffi_or_triton():
    """The GPU image has no numpy or cffi; a CPU run should not pay for importing triton."""
    import subprocess
    import sys
    script = (
        "import sys\n"
        "for name in ('numpy', 'engined._kimi_helper', 'cffi'): sys.modules[name] = None\n"
        "from engined import ops\n"
        "from engined.ops import registry\n"
        "assert registry.resolve('w4a16_gemv', 'cuda').name == 'triton'\n"
        "assert 'triton' not in sys.modules, 'triton imported eagerly'\n"
        "from engined import helper\n"
        "try:\n"
        "    helper.require()\n"
        "except helper.HelperError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: C helper not built" in done.stdout
