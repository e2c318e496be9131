"""benchmarks.device: one run compares every quantity on a device with the CPU float64 reference; on the CPU
itself the float64 rerun must agree exactly and the dense check must hold."""
from benchmarks import device


def test_cpu_against_itself(tmp_path, capsys):
    out = tmp_path / "t.md"
    assert device.main(["--device", "cpu", "--sizes", "tiny", "--repeats", "1", "--out", str(out)]) == 0
    rows = [r.split("|")[1:-1] for r in out.read_text().splitlines() if r.startswith("| n=")]
    assert [r[1].strip() for r in rows] == ["cpu float64", "cpu float64", "cpu float32"]
    assert rows[0][4].strip() == "ref" and float(rows[0][5]) < 1e-12  # CPU vs the dense float64 matrices
    assert float(rows[1][4].split()[0]) < 1e-12  # same device, same dtype: the same numbers
    assert 0 < float(rows[2][4].split()[0]) < 1e-4  # float32 differs, within its precision
