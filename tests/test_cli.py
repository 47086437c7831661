"""The ``tb-introspect`` console script, run for real in subprocesses.

Covers ``--help``, usage errors and exit codes, ``diagnose`` (text, ``--json``, no TensorFlow
import), ``demo`` into an existing logdir (new run names, nothing overwritten), a port in use,
and ``demo --serve`` against the real TensorBoard it starts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.shared_runs import link_runs

REPO = Path(__file__).resolve().parents[1]
CLI = shutil.which("tb-introspect", path=os.path.dirname(sys.executable)) or shutil.which(
    "tb-introspect"
)
pytestmark = pytest.mark.skipif(
    CLI is None, reason="console script not installed (pip install -e .)"
)
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``path`` with its size and modification time."""
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def small_logdir(trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's quick demo runs (made by the real console script, conftest.py), as
    links in a logdir of this module's own: ``demo`` adds a run to it below."""
    runs = {p.name: p for p in sorted(trained.demo.iterdir()) if p.is_dir()}
    return link_runs(runs, tmp_path_factory.mktemp("cli") / "logs")


# --------------------------------------------------------------------------- help, usage


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), ("demo", "diagnose")),
        (("demo",), ("--logdir", "--serve", "--port", "--host", "--quick", "healthy_cnn",
                     "lr_too_high_cnn", "dying_relu_mlp", "vanishing_sigmoid_mlp")),
        (("diagnose",), ("LOGDIR", "--json", "--run")),
    ],
)
def test_help(args: tuple[str, ...], expected: tuple[str, ...]) -> None:
    r = cli(*args, "--help", timeout=60)
    assert r.returncode == 0, r.stderr
    for word in expected:
        assert word in r.stdout


def test_usage_errors_exit_2() -> None:
    r = cli(timeout=60)
    assert r.returncode == 2 and "usage:" in r.stderr
    r = cli("demo", "--epochs", "0", timeout=60)
    assert r.returncode == 2 and "positive integer" in r.stderr
    r = cli("demo", "--port", "70000", timeout=60)
    assert r.returncode == 2 and "port" in r.stderr
    r = cli("demo", "--scenario", "nope", timeout=60)
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = cli("--version", timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("tb-introspect ")


def test_version_is_written_once() -> None:
    """``--version``, the installed distribution's metadata and ``__version__`` agree."""
    from importlib.metadata import version

    import tb_introspect

    r = cli("--version", timeout=60)
    assert r.stdout.strip() == f"tb-introspect {tb_introspect.__version__}"
    assert version("tb-introspect") == tb_introspect.__version__
    files = [REPO / "setup.py", REPO / "frontend" / "package.json"]
    assert not any(tb_introspect.__version__ in f.read_text() for f in files)


def test_run_demo_script_from_checkout() -> None:
    r = subprocess.run([sys.executable, str(REPO / "demo" / "run_demo.py"), "--help"],
                       capture_output=True, text=True, timeout=60, env=ENV)
    assert r.returncode == 0 and "--serve" in r.stdout


# --------------------------------------------------------------------------- diagnose


def test_diagnose_missing_logdir(tmp_path: Path) -> None:
    r = cli("diagnose", str(tmp_path / "nowhere"), timeout=60)
    assert r.returncode == 2
    assert "does not exist" in r.stderr and "nowhere" in r.stderr
    assert "Traceback" not in r.stderr


def test_diagnose_logdir_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file.txt"
    f.write_text("not a logdir")
    r = cli("diagnose", str(f), timeout=60)
    assert r.returncode == 2 and "not a directory" in r.stderr


def test_diagnose_logdir_without_data(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("no events here")
    r = cli("diagnose", str(tmp_path), timeout=120)
    assert r.returncode == 1
    assert "no tb-introspect runs found" in r.stderr


def test_diagnose_text(small_logdir: Path) -> None:
    r = cli("diagnose", str(small_logdir), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    # The findings engine's own report (diagnose.format_findings), one block per run.
    assert "run 3_dying_relu_mlp:" in out and "run 4_vanishing_sigmoid_mlp:" in out
    vanishing = next(line for line in out.splitlines() if "vanishing_gradients:" in line)
    assert "WARNING" in vanishing and "'dense1'" in vanishing and "'classifier'" in vanishing
    assert "loss_not_decreasing:" in out
    r = cli("diagnose", str(small_logdir), "--verbose", "--run", "4_vanishing_sigmoid_mlp",
            timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for text in ("evidence: first_layer_rms=", "why: ", "try: "):
        assert text in r.stdout


def test_diagnose_json_reports_the_vanishing_gradients(small_logdir: Path) -> None:
    r = cli("diagnose", str(small_logdir), "--json", "--run", "4_vanishing_sigmoid_mlp",
            timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert [e["run"] for e in doc["runs"]] == ["4_vanishing_sigmoid_mlp"]
    findings = {f["kind"]: f for f in doc["runs"][0]["findings"]}
    g = findings["vanishing_gradients"]
    assert g["severity"] == "warning" and g["layers"][0] == "dense1"
    assert g["jump"] == {"tab": "overview", "view": "gradient", "chart": "stack"}
    # the first layer gets orders of magnitude less gradient than the classifier
    assert g["evidence"]["orders_below_last"] > 2
    assert g["evidence"]["first_layer_rms"] < 1e-2 * g["evidence"]["last_layer_rms"]
    # and the model does not learn
    loss = findings["loss_not_decreasing"]
    assert loss["evidence"]["median_at_end"] > 2.0


def test_diagnose_unknown_run(small_logdir: Path) -> None:
    r = cli("diagnose", str(small_logdir), "--run", "no_such_run", timeout=120)
    assert r.returncode == 1 and "no_such_run" in r.stderr


def test_diagnose_does_not_import_tensorflow(small_logdir: Path) -> None:
    code = (
        "import sys\n"
        # tqdm and Keras are the demo's and the writer's: diagnose runs without them.
        "sys.modules.update(tqdm=None, keras=None)\n"
        "from tb_introspect.cli import main\n"
        f"rc = main(['diagnose', {str(small_logdir)!r}, '--json'])\n"
        "tf = [m for m in sys.modules if m == 'tensorflow' or m.startswith('tensorflow.')]\n"
        "print('RC', rc, 'TF', tf, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=ENV)
    assert "RC 0 TF []" in r.stderr, r.stderr[-3000:]


# --------------------------------------------------------------------------- demo


@pytest.fixture(scope="module")
def served_demo(trained, tmp_path_factory: pytest.TempPathFactory):
    """``demo --serve`` of one scenario into a logdir that already holds the session's demo
    runs: one training for both what a demo does to an existing logdir and what ``--serve``
    starts. Yields the process once TensorBoard is up: (process, its url, its output so far,
    the logdir, snapshots before and after training)."""
    runs = {p.name: p for p in sorted(trained.demo.iterdir()) if p.is_dir()}
    logdir = link_runs(runs, tmp_path_factory.mktemp("serve") / "logs")
    before = snapshot(logdir)
    port = free_port()
    proc = subprocess.Popen(
        [CLI, "demo", "--serve", "--host", "127.0.0.1", "--port", str(port), "--logdir",
         str(logdir), "--epochs", "1", "--scenario", "vanishing_sigmoid_mlp", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV, cwd=REPO,
        # A CI runner may start us with SIGINT ignored, which children inherit; Python then
        # installs no KeyboardInterrupt handler and the Ctrl+C below would do nothing.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        url = None
        deadline = time.monotonic() + 500
        assert proc.stdout is not None
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "TensorBoard is serving the demo at" in line:
                url = line.split(" at ", 1)[1].split()[0]
                break
        # Keep reading: the CLI forwards TensorBoard's output, and a full pipe would block it.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield proc, url, port, "".join(lines), logdir, before, snapshot(logdir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_into_existing_logdir_adds_new_runs(served_demo) -> None:
    _, url, _, out, _, before, after = served_demo
    assert url is not None, out
    # Nothing that was there changed...
    assert {k: after[k] for k in before} == before
    # ...and the new run sits beside the old one under a distinct name.
    new_runs = {Path(k).parts[0] for k in after if k not in before}
    assert new_runs == {"4_vanishing_sigmoid_mlp_2"}
    assert "4_vanishing_sigmoid_mlp_2" in out


def test_demo_logdir_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "taken"
    f.write_text("x")
    r = cli("demo", "--logdir", str(f), "--epochs", "1", timeout=120)
    assert r.returncode == 2 and "not a directory" in r.stderr
    assert "Traceback" not in r.stderr


def test_demo_unwritable_logdir(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    r = cli("demo", "--logdir", str(tmp_path / "file" / "logs"), "--epochs", "1", timeout=120)
    assert r.returncode == 2 and "cannot write to --logdir" in r.stderr
    assert "Traceback" not in r.stderr


def test_demo_serve_port_in_use_fails_before_training(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = cli("demo", "--serve", "--host", "127.0.0.1", "--port", str(port),
                "--logdir", str(tmp_path / "logs"), timeout=120)
    assert r.returncode == 2
    assert f"port {port} is already in use" in r.stderr and "--port" in r.stderr
    assert not (tmp_path / "logs").exists()  # it did not train first


def test_demo_serve_starts_tensorboard(served_demo) -> None:
    proc, url, port, out, logdir, _, _ = served_demo
    assert url == f"http://127.0.0.1:{port}/#introspect", out
    # TensorBoard answers before it has loaded the logdir: wait for the new run's tags.
    new, every_run = "4_vanishing_sigmoid_mlp_2", sorted(p.name for p in logdir.iterdir())
    deadline = time.monotonic() + 180
    while True:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/data/plugin/introspect/runs", timeout=60
        ) as resp:
            runs = {r["run"]: r for r in json.load(resp)["runs"]}
        loaded = sorted(runs) == every_run and runs[new]["views"]["gradient"] == 18
        if loaded or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sorted(runs) == every_run
    assert runs[new]["views"]["gradient"] == 18
    proc.send_signal(signal.SIGINT)  # what Ctrl+C does
    assert proc.wait(timeout=240) == 0  # a loaded CI machine tears TF down slowly
    # TensorBoard went with it: the port is free again.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
