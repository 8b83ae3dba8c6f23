"""A real broker for the tests: the `ricochet-broker` binary (debug build,
or $RICOCHET_BROKER_BIN) as a child process on a temp data dir, listening
on a port it picks itself, read back from its stdout the way
testkit/src/process.rs does. `kill()` is SIGKILL (no clean shutdown);
`start()` brings it back on the same data dir and port."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LISTENING = "ricochet-broker listening on "


def broker_bin() -> Path:
    given = os.environ.get("RICOCHET_BROKER_BIN")
    path = Path(given) if given else REPO / "target" / "debug" / "ricochet-broker"
    if not path.is_file():
        raise RuntimeError(
            f"no ricochet-broker binary at {path}: run `cargo build -p ricochet-broker` "
            "or set RICOCHET_BROKER_BIN"
        )
    return path


class Broker:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.listen = "127.0.0.1:0"
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, timeout: float = 30.0) -> None:
        assert self.proc is None, "already running"
        self.proc = subprocess.Popen(
            [
                str(broker_bin()),
                "--data-dir", str(self.data_dir),
                "--listen", self.listen,
                "--metrics-listen", "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            env={**os.environ, "RUST_LOG": os.environ.get("RICOCHET_TEST_LOG", "warn")},
        )
        addr: queue.Queue[str] = queue.Queue()
        stdout = self.proc.stdout

        def drain() -> None:
            # Read to the end so the broker never blocks on a full pipe.
            assert stdout is not None
            for line in stdout:
                if line.startswith(LISTENING):
                    # `ADDR (TLS off, authentication off)`: the address first.
                    addr.put(line[len(LISTENING):].split()[0])

        threading.Thread(target=drain, daemon=True).start()
        try:
            got = addr.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise RuntimeError(f"the broker did not listen within {timeout}s")
        # Come back on the same port after a restart.
        self.listen = got
        self.url = f"http://{got}"

    def kill(self) -> None:
        """SIGKILL and reap: nothing flushed on the way out."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None


@pytest.fixture
def broker(tmp_path: Path):
    b = Broker(tmp_path / "data")
    b.start()
    yield b
    b.kill()
