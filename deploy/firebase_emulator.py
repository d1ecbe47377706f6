"""The Firebase Auth emulator (npm `firebase-tools`), run locally and offline, and test helpers
that drive it through its REST API. Every step is idempotent; nothing happens at import time.

Findings this module relies on (firebase-tools 15.34.2, Node 20, Debian 12, no internet):

- The Auth emulator is pure Node: it starts with only `node` on PATH (no Java, which only the
  Firestore / Database / Pub/Sub / Storage emulators need) and downloads nothing, as long as the
  Emulator UI (a downloaded bundle) is disabled. A `demo-*` project id needs no login and no
  network; the emulator serves any project id, but its sign-up / sign-in endpoints (which
  authenticate with an API key, any key) always use the project given to `--project`.
- Network calls the CLI makes by itself, all disabled or made harmless by `emulator_env()`:
  the update check (update-notifier: NO_UPDATE_NOTIFIER, and CI), the "message of the day"
  (fetchMOTD: skipped when CI is set; it could even make the CLI exit if a remote minimum
  version is above ours) and usage analytics (only with consent stored in the configstore,
  which XDG_CONFIG_HOME points at an empty directory under the state dir). The one remaining
  call, a notification to a VS Code extension on localhost:40001, fails at once.
- `npm install --ignore-scripts`: the only install scripts are re2's (a native build through
  node-gyp, which would fetch Node headers) and protobufjs's (a version notice); the Auth
  emulator needs neither. Install: ~2 minutes on 2 cores, ~312 MB in node_modules.
- Start-up to an open port: ~12 s, all CPU (loading the CLI and the emulator's OpenAPI spec).
- The emulator Hub and the logging emulator always start; they are bound to the same host and
  left on their default ports (4400, 4500) which the CLI moves to a free port when taken, so
  they cannot clash. `singleProjectMode` is off, so requests for other project ids are served
  (each project has its own accounts) without warnings.
- Tokens it issues are unsigned JWTs: header {"alg": "none", "typ": "JWT"}, empty signature,
  payload with iss https://securetoken.google.com/<project>, aud <project>, sub / user_id the
  uid, iat / exp (one hour). See fence/auth.py for what firebase-admin verifies of them.
- Admin endpoints (`/identitytoolkit.googleapis.com/v1/projects/<project>/accounts:...`) accept
  `Authorization: Bearer owner`; `DELETE /emulator/v1/projects/<project>/accounts` wipes one
  project's accounts. State is in memory only: a restart starts empty.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

PACKAGE = "firebase-tools"
PINNED = "15.34.2"  # `npm view firebase-tools version` when pinned; needs Node >= 20
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9099
DEFAULT_PROJECT = "demo-geofence"  # demo-*: no login, no real project behind it
FAKE_API_KEY = "fake-api-key"  # the emulator accepts any API key
ADMIN_BEARER = "owner"  # the emulator's stand-in for admin credentials
INSTALL_MARKER = ".geofence-firebase-tools-version"
EMULATOR_HOST_ENV = "FIREBASE_AUTH_EMULATOR_HOST"
POLL_INTERVAL = 0.2
IDENTITY_V1 = "/identitytoolkit.googleapis.com/v1"
SIGN_UP = f"{IDENTITY_V1}/accounts:signUp?key={FAKE_API_KEY}"
SIGN_IN = f"{IDENTITY_V1}/accounts:signInWithPassword?key={FAKE_API_KEY}"
HTTP_TIMEOUT = 10.0


class EmulatorError(RuntimeError):
    """The emulator could not be installed, started, stopped or used."""


# --------------------------------------------------------------------------- install


def firebase_bin(prefix: Path) -> Path:
    return prefix / "node_modules" / ".bin" / "firebase"


def installed_version(prefix: Path) -> str | None:
    """The firebase-tools version under prefix, if a complete install put it there."""
    try:
        marker = (prefix / INSTALL_MARKER).read_text().strip()
        package = json.loads((prefix / "node_modules" / PACKAGE / "package.json").read_text())
    except (OSError, ValueError):
        return None
    # The marker is written after npm succeeded: an interrupted install has none (or an old one).
    version = package.get("version")
    return marker if version == marker and firebase_bin(prefix).exists() else None


def ensure_installed(prefix: Path, version: str = PINNED, *, npm: str = "npm",
                     timeout: float = 1200.0) -> Path:
    """Install firebase-tools==version into prefix (unless it is there); the `firebase` path."""
    if installed_version(prefix) == version:
        return firebase_bin(prefix)
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / INSTALL_MARKER).unlink(missing_ok=True)
    command = install_command(prefix, version, npm)
    env = dict(os.environ, NO_UPDATE_NOTIFIER="1")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmulatorError(f"{' '.join(command)} failed: {exc}") from exc
    if done.returncode != 0:
        raise EmulatorError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    (prefix / INSTALL_MARKER).write_text(version + "\n")
    if installed_version(prefix) != version:
        raise EmulatorError(f"npm succeeded but {PACKAGE} {version} is not in {prefix}")
    return firebase_bin(prefix)


def install_command(prefix: Path, version: str = PINNED, npm: str = "npm") -> list[str]:
    return [npm, "install", "--prefix", str(prefix), "--save-exact", "--ignore-scripts",
            "--no-audit", "--no-fund", "--no-update-notifier", f"{PACKAGE}@{version}"]


# --------------------------------------------------------------------------- run


def write_config(dir: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> Path:
    """firebase.json with only the Auth emulator on host:port, no UI; returns its path."""
    config = {
        "emulators": {
            "auth": {"host": host, "port": port},
            # Always started by the CLI; same host, default ports, moved when taken.
            "hub": {"host": host},
            "logging": {"host": host},
            "ui": {"enabled": False},  # a download; the Auth emulator works without it
            "singleProjectMode": False,
        }
    }
    dir.mkdir(parents=True, exist_ok=True)
    path = dir / "firebase.json"
    text = json.dumps(config, indent=2) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def emulator_env(dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the emulator: base (os.environ) without update checks, the message
    of the day or analytics, and with the CLI's config store under dir."""
    env = dict(os.environ if base is None else base)
    env.update(
        NO_UPDATE_NOTIFIER="1",
        CI="true",  # no MOTD fetch (fetchMOTD.js), no update-notifier (is-ci)
        XDG_CONFIG_HOME=str(dir / "config"),  # configstore: no stored login, no usage consent
    )
    env.pop(EMULATOR_HOST_ENV, None)  # the CLI does not need it; keep it out of its children
    return env


def launch(firebase: Path, dir: Path, project_id: str = DEFAULT_PROJECT,
           log_path: Path | None = None) -> int:
    """Start the emulator detached (own session, reparented to init); returns its pid.
    Output is appended to log_path (default dir/emulator.log); the config is dir/firebase.json."""
    config = dir / "firebase.json"
    if not config.exists():
        raise EmulatorError(f"{config} is missing; call write_config() first")
    log = log_path or dir / "emulator.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # The shell starts the CLI in the background and exits, so the emulator is not our child
    # (no zombie, no "still running" warning) and survives the caller; `$!` is its pid since
    # `env` (the script's shebang) execs node in place.
    script = 'log=$1; shift; "$@" >>"$log" 2>&1 </dev/null & echo $!'
    command = ["/bin/sh", "-c", script, "sh", str(log), str(firebase), "emulators:start",
               "--only", "auth", "--project", project_id, "--config", str(config)]
    try:
        done = subprocess.run(command, cwd=dir, env=emulator_env(dir), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=30, check=True,
                              start_new_session=True)
        return int(done.stdout.strip())
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise EmulatorError(f"cannot launch {firebase}: {exc}") from exc


def running(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout: float = 1.0) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def await_started(host: str, port: int, timeout: float = 120.0, pid: int | None = None,
                  log_path: Path | None = None) -> None:
    """Poll until the emulator accepts connections; fail at the deadline, or at once if the
    process `pid` (from launch) died."""
    deadline = time.monotonic() + timeout
    while not running(host, port):
        if pid is not None and not alive(pid):
            raise EmulatorError(f"the Auth emulator (pid {pid}) exited{_log_tail(log_path)}")
        if time.monotonic() >= deadline:
            raise EmulatorError(f"the Auth emulator is not up on {host}:{port} after {timeout:.0f} s"
                                f"{_log_tail(log_path)}")
        time.sleep(POLL_INTERVAL)


def start(prefix: Path, dir: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          project_id: str = DEFAULT_PROJECT, timeout: float = 120.0) -> int | None:
    """Install, configure and start the emulator unless it already answers on host:port.
    Returns the pid it started, or None if it was already running (not ours to stop)."""
    if running(host, port):
        return None
    firebase = ensure_installed(prefix)
    write_config(dir, host, port)
    log = dir / "emulator.log"
    pid = launch(firebase, dir, project_id, log)
    try:
        await_started(host, port, timeout, pid=pid, log_path=log)
    except EmulatorError:
        stop(pid)
        raise
    return pid


def find_pid(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> int | None:
    """The pid of the `firebase emulators:start` process listening on host:port, if any (a
    listener on the wildcard address matches any host). Needs the right to read other
    processes' fds (root, or the same user)."""
    found = _holding(host, port, lambda cmd: b"emulators:start" in cmd.split(b"\0"))
    return found[0] if found else None


def leftover_pids(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> list[int]:
    """Processes of firebase-tools still listening on host:port once the emulator's own process
    is gone (a child of it keeps the port a moment: `up` right after `down` once found it taken)."""
    return _holding(host, port, lambda cmd: b"firebase" in cmd)


def _holding(host: str, port: int, wanted: Callable[[bytes], bool]) -> list[int]:
    """The pids whose command line `wanted` accepts and that hold a listening socket on host:port."""
    inodes = _listening_inodes(host, port)
    if not inodes:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not wanted((entry / "cmdline").read_bytes()):
                continue
            links = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            pids.append(int(entry.name))
    return pids


def alive(pid: int) -> bool:
    """True while pid runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


def stop(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM (the CLI shuts the emulators down cleanly), wait, SIGKILL at the deadline."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while alive(pid):
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_INTERVAL)
        else:
            return
    raise EmulatorError(f"the Auth emulator (pid {pid}) survived SIGKILL")


def _listening_inodes(host: str, port: int) -> set[str]:
    try:
        wanted = ipaddress.ip_address(host)
    except ValueError:
        wanted = None  # a name: match any address
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, _, port_hex = fields[1].partition(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            local = _proc_net_address(address)
            if wanted is None or local.is_unspecified or local == wanted:
                inodes.add(fields[9])
    return inodes


def _proc_net_address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # /proc/net/tcp* print addresses as 32-bit words in host (little-endian) order.
    raw = bytes.fromhex(hex_address)
    swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(swapped)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _log_tail(log_path: Path | None, lines: int = 20) -> str:
    if log_path is None:
        return ""
    try:
        tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"; last lines of {log_path}:\n" + "\n".join(tail)


# --------------------------------------------------------------------------- REST helpers (tests)


def sign_up(host: str, port: int, project_id: str, email: str, password: str) -> tuple[str, str]:
    """Create an email/password user; (uid, id_token). The emulator signs users up in its
    default project (the one it was started with): a mismatch with project_id is an error."""
    credentials = {"email": email, "password": password, "returnSecureToken": True}
    reply = _call(host, port, "POST", SIGN_UP, credentials)
    token = str(reply["idToken"])
    _expect_project(token, project_id)
    return str(reply["localId"]), token


def sign_in(host: str, port: int, project_id: str, email: str, password: str) -> str:
    """A fresh ID token for an existing email/password user."""
    credentials = {"email": email, "password": password, "returnSecureToken": True}
    reply = _call(host, port, "POST", SIGN_IN, credentials)
    token = str(reply["idToken"])
    _expect_project(token, project_id)
    return token


def default_project(host: str, port: int) -> str:
    """The project a running emulator signs users up in (an anonymous probe user, deleted)."""
    reply = _call(host, port, "POST", SIGN_UP, {"returnSecureToken": True})
    project = str(decode_unsigned(str(reply["idToken"]))[1]["aud"])
    delete_user(host, port, project, str(reply["localId"]))
    return project


def delete_user(host: str, port: int, project_id: str, uid: str) -> None:
    _admin(host, port, project_id, "accounts:delete", {"localId": uid})


def disable_user(host: str, port: int, project_id: str, uid: str, disabled: bool = True) -> None:
    _admin(host, port, project_id, "accounts:update", {"localId": uid, "disableUser": disabled})


def set_claims(host: str, port: int, project_id: str, uid: str, claims: Mapping[str, Any]) -> None:
    """Custom claims on a user (in the next token it gets), as the Admin SDK's
    set_custom_user_claims sets them."""
    _admin(host, port, project_id, "accounts:update",
           {"localId": uid, "customAttributes": json.dumps(claims)})


def revoke_tokens(host: str, port: int, project_id: str, uid: str, valid_since: int) -> None:
    """Tokens issued before valid_since (epoch seconds) count as revoked. Setting it directly
    (rather than "now", as revoke_refresh_tokens does) avoids waiting for the next second."""
    _admin(host, port, project_id, "accounts:update", {"localId": uid, "validSince": str(valid_since)})


def create_user(host: str, port: int, project_id: str, email: str, password: str) -> str:
    """An admin-created user in any project (sign_up only reaches the default one); its uid."""
    reply = _admin(host, port, project_id, "accounts", {"email": email, "password": password})
    return str(reply["localId"])


def clear_accounts(host: str, port: int, project_id: str) -> None:
    """Delete every account of one project (other projects are untouched)."""
    _call(host, port, "DELETE", f"/emulator/v1/projects/{quote(project_id, safe='')}/accounts")


def _admin(host: str, port: int, project_id: str, method: str, body: Mapping[str, Any]) -> dict[str, Any]:
    path = f"{IDENTITY_V1}/projects/{quote(project_id, safe='')}/{method}"
    return _call(host, port, "POST", path, body, {"Authorization": f"Bearer {ADMIN_BEARER}"})


def _call(host: str, port: int, method: str, path: str, body: Mapping[str, Any] | None = None,
          headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{host}:{port}{path}", data=data, method=method,
        headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        raise EmulatorError(f"{method} {path.split('?')[0]}: HTTP {exc.code} {_error_message(exc)}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EmulatorError(f"{method} {path.split('?')[0]}: {exc}") from exc
    reply = json.loads(text) if text.strip() else {}
    if not isinstance(reply, dict):
        raise EmulatorError(f"{method} {path.split('?')[0]}: unexpected reply {text[:200]!r}")
    return reply


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"]["message"])
    except (ValueError, KeyError, TypeError, OSError):
        return str(exc.reason)


def _expect_project(token: str, project_id: str) -> None:
    audience = decode_unsigned(token)[1].get("aud")
    if audience != project_id:
        raise EmulatorError(f"the emulator signs users up in project {audience!r}, not {project_id!r}; "
                            "start it with --project " + project_id)


# --------------------------------------------------------------------------- test tokens
#
# Emulator tokens are unsigned, so a test can rewrite one and firebase-admin, in emulator mode,
# cannot tell (it checks no signature). What each rewritten token proves:
# - expired_token: our own exp check works (firebase-admin checks no exp in emulator mode; in
#   real mode google-auth would refuse it too, after the signature check).
# - forged_token(sub=<unknown uid>): check_revoked's user lookup is what refuses an invented
#   identity in emulator mode; with check_revoked=False it would be accepted.
# - forged_token(aud=... / iss=...): the project binding is checked even without signatures.
# - forged_token(email=...) for an existing uid: ACCEPTED in emulator mode. Only real mode's
#   RS256 signature catches tampering with the claims of a real user.


def decode_unsigned(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, payload) of a JWT, without any verification."""
    try:
        header, payload, _ = token.split(".")
        return _b64decode_json(header), _b64decode_json(payload)
    except ValueError as exc:
        raise EmulatorError(f"not a JWT: {exc}") from None


def encode_unsigned(payload: Mapping[str, Any], header: Mapping[str, Any] | None = None) -> str:
    """An unsigned JWT, as the emulator makes them ({"alg": "none"}, empty signature)."""
    parts = (header or {"alg": "none", "typ": "JWT"}, payload)
    return ".".join(_b64encode_json(part) for part in parts) + "."


def forged_token(token: str, **claims: Any) -> str:
    """token with claims replaced (uid: pass both sub and user_id), re-encoded unsigned."""
    header, payload = decode_unsigned(token)
    return encode_unsigned({**payload, **claims}, header)


def expired_token(token: str, now: float | None = None) -> str:
    """token with `exp` in the past. `iat` is kept, so the user's validSince (check_revoked)
    does not refuse it: only an expiry check can."""
    _, payload = decode_unsigned(token)
    current = int(time.time() if now is None else now)
    return forged_token(token, exp=min(int(payload["iat"]), current) - 1)


def _b64decode_json(segment: str) -> dict[str, Any]:
    value = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    if not isinstance(value, dict):
        raise ValueError("segment is not a JSON object")
    return value


def _b64encode_json(value: Mapping[str, Any]) -> str:
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
