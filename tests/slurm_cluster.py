"""A real two-node Slurm cluster on this machine (Debian slurm-wlm): munged, slurmctld, two slurmd.

Both nodes are this host under two names (its short hostname and `localhost`), each with its own slurmd
port. Daemons run from a private directory and are stopped by PID.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ["slurm-wlm", "slurmctld", "slurmd", "slurm-client", "munge"]


def available() -> bool:
    return all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "munged", "sbatch"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SlurmCluster:
    def __init__(self, root: Path, gpu_gres: bool = False) -> None:
        """gpu_gres: one GPU GRES per node (`GresTypes=gpu`, `Gres=gpu:1`). There is no GPU here: its device file
        is /dev/null (Slurm refuses a gpu GRES without a File, and registers the node INVAL with it missing)."""
        self.root = root
        self.gpu_gres = gpu_gres
        self.host = socket.gethostname().split(".")[0]
        self.nodes = [self.host, "localhost"]
        self.pids: list[int] = []
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self) -> SlurmCluster:
        root = self.root
        for sub in ("state", "spool0", "spool1", "log", "run", "munge"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        socket_path = root / "munge" / "munge.socket"
        subprocess.run(
            ["munged", "--force", f"--key-file={key}", f"--socket={socket_path}",
             f"--pid-file={root / 'munge' / 'munged.pid'}", f"--log-file={root / 'munge' / 'munged.log'}",
             f"--seed-file={root / 'munge' / 'seed'}"],
            check=True,
        )  # fmt: skip
        self.pids.append(int((root / "munge" / "munged.pid").read_text()))
        ctld_port = _free_port()
        gres = " Gres=gpu:1" if self.gpu_gres else ""
        node_ports = [_free_port(), _free_port()]
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=toolkit-test",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    "SlurmUser=root",
                    f"AuthInfo=socket={socket_path}",
                    "AuthType=auth/munge",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "SlurmdParameters=config_overrides",
                    "ReturnToService=2",
                    "MinJobAge=3600",
                    "KillWait=30",
                    f"StateSaveLocation={root / 'state'}",
                    f"SlurmdSpoolDir={root / 'spool%n'}",
                    f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
                    f"SlurmdPidFile={root / 'run' / 'slurmd-%n.pid'}",
                    f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
                    *(["GresTypes=gpu"] if self.gpu_gres else []),
                    *(
                        f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs=2 RealMemory=8000{gres}"
                        for name, port in zip(self.nodes, node_ports, strict=True)
                    ),
                    f"PartitionName=main Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
                ]
            )
            + "\n"
        )
        if self.gpu_gres:  # read by each slurmd from slurm.conf's directory
            (root / "gres.conf").write_text("Name=gpu Count=1 File=/dev/null\n")
        # one spool dir per node name
        for name in self.nodes:
            (root / f"spool{name}").mkdir(exist_ok=True)
        subprocess.run(["slurmctld"], env=self.env, check=True)
        self.pids.append(self._wait_pid(root / "run" / "slurmctld.pid"))
        for name in self.nodes:
            subprocess.run(["slurmd", "-N", name], env=self.env, check=True)
            self.pids.append(self._wait_pid(root / "run" / f"slurmd-{name}.pid"))
        self._wait_idle()
        return self

    def unreachable_conf(self) -> Path:
        """This cluster's slurm.conf with its controller gone (a closed port), as when slurmctld restarts: the client
        tools fail at once ("Unable to contact slurm controller"). A missing slurm.conf is not the same fault: the
        tools then look for a controller over DNS for about a minute."""
        conf = self.root / "unreachable.conf"
        lines = [line for line in self.conf.read_text().splitlines() if not line.startswith("SlurmctldPort=")]
        conf.write_text("\n".join([*lines, f"SlurmctldPort={_free_port()}", "MessageTimeout=1"]) + "\n")
        return conf

    @staticmethod
    def _wait_pid(path: Path) -> int:
        for _ in range(100):
            if path.exists() and path.read_text().strip():
                return int(path.read_text())
            time.sleep(0.1)
        raise RuntimeError(f"daemon did not write {path}")

    def _wait_idle(self) -> None:
        for _ in range(100):
            info = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
            states = info.stdout.split()
            if states and all(s == "idle" for s in states):
                return
            time.sleep(0.2)
        logs = (self.root / "log" / "slurmctld.log").read_text()[-2000:]
        raise RuntimeError(f"nodes never became idle: {info.stdout} {info.stderr}\n{logs}")

    def stop(self) -> None:
        for pid in reversed(self.pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
