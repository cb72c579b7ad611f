"""What a run records of its machine: the CPU named precisely enough to tell two machines of one kind apart."""

from transformer_jax import machine

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu vme avx512f amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8488C
"""


def test_the_cpu_is_its_model_name_with_family_and_model_numbers(tmp_path):
    (tmp_path / "xeon").write_text(XEON)
    assert machine.cpu_model(str(tmp_path / "xeon")) == "Intel(R) Xeon(R) Platinum 8488C (family 6, model 143)"
    (tmp_path / "epyc").write_text("processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n")
    assert machine.cpu_model(str(tmp_path / "epyc")) == "AMD EPYC (family 26, model 2)"
    (tmp_path / "arm").write_text("processor\t: 0\nmodel name\t: Neoverse-V2\nCPU implementer\t: 0x41\n")
    assert machine.cpu_model(str(tmp_path / "arm")) == "Neoverse-V2"  # no x86 family: the name alone
