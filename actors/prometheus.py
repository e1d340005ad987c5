"""A Prometheus server for a run (``runtime.run --prometheus``): the Ray
dashboard's metrics page and ``docs/monitoring.md``'s graphs need one.

``PrometheusServer(out_dir, port)`` starts the ``prometheus`` binary (Debian's
``prometheus`` package) on ``127.0.0.1:port``, scraping every Ray node this
machine's Ray session lists in its service-discovery file
(``<ray temp dir>/prom_metrics_service_discovery.json``, refreshed by Ray as
nodes come and go) every second. Its configuration, log and data go to
``OUT/prometheus/``: after the run, ``prometheus --config.file
OUT/prometheus/prometheus.yml --storage.tsdb.path OUT/prometheus/data``
serves the run's series again. It is stopped (its whole process group) when
the run ends, however it ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from runtime.topology import TopologyError

#: Ray's list of its nodes' metrics endpoints (Prometheus file service discovery)
RAY_SD_FILE = "prom_metrics_service_discovery.json"
DEFAULT_PORT = 9090
#: how long Prometheus may take to answer ``/-/ready``
READY_S = 60.0

CONFIG = """# written by runtime.run --prometheus
global:
  scrape_interval: 1s
  evaluation_interval: 5s
scrape_configs:
  - job_name: ray
    file_sd_configs:
      - files: ['{sd_file}']
        refresh_interval: 1s
"""


def binary() -> str:
    """The ``prometheus`` executable; a one-line ``TopologyError`` if absent."""
    found = shutil.which("prometheus")
    if found is None:
        raise TopologyError("--prometheus: no prometheus binary on PATH (Debian: "
                            "apt-get install prometheus)")
    return found


class PrometheusServer:
    """A context manager: the server runs inside it (module docstring)."""

    def __init__(self, out_dir: str | os.PathLike[str], port: int = DEFAULT_PORT,
                 ray_temp_dir: str = "/tmp/ray") -> None:
        self.exe = binary()
        self.dir = Path(out_dir) / "prometheus"
        self.port = int(port)
        self.sd_file = Path(ray_temp_dir) / RAY_SD_FILE
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "prometheus.yml"
        config.write_text(CONFIG.format(sd_file=self.sd_file))
        log = open(self.dir / "prometheus.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            self.proc = subprocess.Popen(
                [self.exe, f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + READY_S
        while not self.ready():
            if self.proc.poll() is not None:
                self.proc = None
                raise TopologyError(f"--prometheus: prometheus exited at start (port "
                                    f"{self.port} in use?); its log: {self.dir / 'prometheus.log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise TopologyError(f"--prometheus: not ready after {READY_S:.0f} s; its log: "
                                    f"{self.dir / 'prometheus.log'}")
            time.sleep(0.2)
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
