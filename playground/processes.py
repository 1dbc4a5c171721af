"""Process checks shared by the local job supervisor and the local model servers, and the environment
they start with."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

# What a job's supervisor and trainer, and a model server, inherit: an allow-list, so nothing else in the
# caller's environment (in a booth: the cookie-signing secret and the visitor's cookie that Voila put into the
# kernel's environment; anywhere: unrelated credentials) can be read from /proc/<pid>/environ.
CHILD_ENV_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "TERM", "SHELL"}
    | {"VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"}
    | {"CURL_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"}
    | {"no_proxy", "all_proxy", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "KUBECONFIG", "WORLD_SIZE"}
)
CHILD_ENV_PREFIXES = (
    "PLAYGROUND_", "PYTHON", "LC_", "XDG_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "PYTORCH_", "CUDA_",
    "NVIDIA_", "NCCL_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "MLFLOW_", "COVERAGE_", "COV_CORE_",
)  # fmt: skip
CHILD_ENV_DENIED = frozenset({"PLAYGROUND_BOOTH_SECRET", "HTTP_COOKIE"})
CHILD_ENV_SETTING = "PLAYGROUND_CHILD_ENV"  # the operator's extra names, comma-separated; NAME_* for a prefix
SERVER_ENV_DENIED = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "KUBECONFIG"})  # a server reads a local dir


def child_env(
    extra: Mapping[str, str] | None = None, *, server: bool = False, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a job or model server starts with: the allowed part of ``environ`` (default
    ``os.environ``) plus ``extra``. Never the booth secret or a visitor's cookie; a server gets no tokens."""
    environ = os.environ if environ is None else environ
    operator = [n.strip() for n in environ.get(CHILD_ENV_SETTING, "").split(",") if n.strip()]
    names = CHILD_ENV_NAMES | {n for n in operator if not n.endswith("*")}
    prefixes = CHILD_ENV_PREFIXES + tuple(n[:-1] for n in operator if n.endswith("*") and len(n) > 1)
    denied = CHILD_ENV_DENIED | (SERVER_ENV_DENIED if server else frozenset())
    env = {k: v for k, v in environ.items() if (k in names or k.startswith(prefixes)) and k not in denied}
    env.update({k: v for k, v in (extra or {}).items() if k not in CHILD_ENV_DENIED})
    return env


_PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread


def process_alive(pid: int | None, *markers: str) -> bool:
    """Whether ``pid`` runs (not a zombie) and, where /proc tells, its command line contains every marker.

    A zombie child of this process counts as gone and is reaped. The markers guard against a
    recycled pid: a dead supervisor's or server's pid taken by another process. An empty command
    line is a process still inside ``exec`` (the kernel sets the arguments up after ``Popen``
    returns): it counts as alive, since it is becoming what was started.
    """
    if not pid or pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return not markers  # someone else's process: not ours when we expect markers
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():  # no /proc (macOS): the signal check is all we have
        return True
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return False
        if markers:
            cmdline = (proc / "cmdline").read_bytes()
            if not cmdline:  # inside exec (Popen has returned, the arguments are not set up yet): starting
                return not int(fields[6]) & _PF_KTHREAD  # kernel threads have no command line either
            text = cmdline.replace(b"\0", b" ").decode(errors="replace")
            return all(marker in text for marker in markers)
    except (OSError, IndexError, ValueError):
        return False
    return True
