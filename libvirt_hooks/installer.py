"""`orion-hooks install/uninstall/status`: put the qemu hook where libvirt runs it, next to any hook already there.

Where it goes. libvirt (since 6.5; verified in 9.0's virhook.c and binary) runs /etc/libvirt/hooks/qemu first,
then every executable regular file directly in /etc/libvirt/hooks/qemu.d/, in strcmp order, each with the same
arguments and the same domain XML on stdin; an operation fails if any of them fails (all still run). So our
hook is one file of our own, qemu.d/orion-vgpu, and a user's `qemu` hook is never moved, wrapped or edited:
chaining is libvirt's, uninstalling is deleting our file. libvirt looks for hooks (the `qemu` file, or a
qemu.d with an executable in it) only when the daemon starts (a SIGHUP reload does not look again): if no qemu
hook existed before, the daemon must be restarted once (`libvirtd_runs_hooks` says whether it has been).
Our hook is idempotent, so a dispatcher `qemu` script that also runs everything in qemu.d/ running it a
second time is harmless.

AppArmor. Where AppArmor is active and libvirt's `abstractions/libvirt-qemu` exists, QEMU may only open
files the profile allows, so the rule `<shm_path_base>/orionsock* rw,` is added between marker lines: to the
`local/abstractions/libvirt-qemu` include when the abstraction includes it (Debian, Ubuntu), else to the
abstraction itself; then the profiles of running domains are reloaded (new domains get a profile generated
from the abstraction when they start). Elsewhere nothing is installed for AppArmor.

`root` relocates every file this module reads or writes (tests install into a temporary directory); the
paths written into the hook (interpreter, server.conf, pid file) are used exactly as given.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from host_agent.server_conf import ConfigError, ShmSettings

HOOKS_DIR = "etc/libvirt/hooks"
HOOK_NAME = "orion-vgpu"
MARKER = "# orion-hooks: the Orion vGPU qemu hook"
MIN_LIBVIRT = (6, 5)
APPARMOR_ENABLED = "sys/module/apparmor/parameters/enabled"
ABSTRACTION = "etc/apparmor.d/abstractions/libvirt-qemu"
LOCAL_ABSTRACTION = "etc/apparmor.d/local/abstractions/libvirt-qemu"
DOMAIN_PROFILES = "etc/apparmor.d/libvirt"
RULE_BEGIN = "# BEGIN orion-vgpu (orion-hooks): QEMU opens Orion regions"
RULE_END = "# END orion-vgpu"
LIBVIRTD_PID_FILE = "run/libvirtd.pid"
SYSTEMD_RUNNING = "run/systemd/system"  # sd_booted(): this directory exists only while systemd is PID 1
RESTART_FIRST = "libvirtd looks for hooks only when it starts: restart it now so that it runs the Orion hook"


class InstallError(Exception):
    """The one line `orion-hooks` prints when it cannot do what was asked."""


@dataclass(frozen=True)
class Paths:
    """Every file the installer touches, under `root`."""

    root: str

    def at(self, relative: str) -> str:
        return os.path.join(self.root, relative)

    @property
    def qemu_hook(self) -> str:
        return self.at(f"{HOOKS_DIR}/qemu")

    @property
    def hook_dir(self) -> str:
        return self.at(f"{HOOKS_DIR}/qemu.d")

    @property
    def hook(self) -> str:
        return os.path.join(self.hook_dir, HOOK_NAME)


def hook_script(python: str, config: str, pid_file: str) -> str:
    """The executable libvirt runs: a few lines of sh that start the Python hook with the project's interpreter.

    `-I`: libvirt's environment decides nothing (no PYTHON* variables, no current directory on sys.path)."""
    q = shlex.quote
    return (f"#!/bin/sh\n{MARKER} (installed by 'orion-hooks install'; 'orion-hooks uninstall' removes it).\n"
            "# libvirt runs it after /etc/libvirt/hooks/qemu, with the same arguments and the domain XML on stdin.\n"
            f"ORION_SERVER_CONF={q(config)}; export ORION_SERVER_CONF\n"
            f"ORION_PID_FILE={q(pid_file)}; export ORION_PID_FILE\n"
            f"exec {q(python)} -I -m libvirt_hooks.qemu_hook \"$@\"\n")


# --- install / uninstall ------------------------------------------------------------------------------------
def install(root: str, python: str, config: str, pid_file: str) -> list[str]:
    """Install the hook and (where AppArmor is active) the rule; returns what was done, for the user."""
    paths = Paths(root)
    # libvirt runs hooks from / with a minimal PATH: every path written into the hook must be absolute.
    python = os.path.abspath(shutil.which(python) or python) if os.sep not in python else os.path.abspath(python)
    config, pid_file = os.path.abspath(config), os.path.abspath(pid_file)
    _check_interpreter(python)
    if root == "/":
        _check_libvirt_version()
    settings = _settings(config)
    script = hook_script(python, config, pid_file)
    hooks_were_seen = _libvirt_sees_qemu_hooks(paths)
    out = []
    if _read(paths.hook) == script and os.access(paths.hook, os.X_OK):
        out.append(f"{paths.hook} is already installed; nothing changed")
    else:
        if os.path.lexists(paths.hook) and MARKER not in (_read(paths.hook) or ""):
            raise InstallError(f"{paths.hook} exists and is not ours; move it away, then run this again")
        first = not os.path.lexists(paths.hook)
        since = None if first else os.stat(paths.hook)
        os.makedirs(paths.hook_dir, mode=0o755, exist_ok=True)
        _write(paths.hook, script, 0o755, tmp_dir=paths.at(HOOKS_DIR))
        if since is not None:  # the file's time says since when a hook is there: status compares libvirtd's start
            os.utime(paths.hook, ns=(since.st_atime_ns, since.st_mtime_ns))
        out.append(f"{'installed' if first else 'updated'} {paths.hook} (runs {python}, reads {config})")
        if os.path.lexists(paths.qemu_hook):
            out.append(f"{paths.qemu_hook} is left as it is; libvirt runs it first, then {paths.hook}")
        daemon = _running_daemon(paths)
        if first and not hooks_were_seen and daemon is None:
            out.append("libvirtd is not running: it runs the Orion hook from its next start")
        elif first and not hooks_were_seen:
            out.append(f"{RESTART_FIRST} (pid {daemon}; {restart_advice(paths, daemon)})")
        elif first:
            out.append("libvirtd already runs qemu hooks here, so it needs no restart: it runs this one from the "
                       "next domain start")
    out += _install_apparmor_rule(paths, settings)
    return out


def uninstall(root: str) -> list[str]:
    """Remove our hook file and AppArmor rule; leave everything else as it was."""
    paths = Paths(root)
    out = []
    text = _read(paths.hook)
    if text is None:
        out.append(f"{paths.hook} is not installed")
    elif MARKER not in text:
        raise InstallError(f"{paths.hook} is not ours (no '{MARKER}' line); left alone")
    else:
        os.unlink(paths.hook)
        out.append(f"removed {paths.hook}")
        for directory in (paths.hook_dir, paths.at(HOOKS_DIR)):
            try:
                os.rmdir(directory)  # only when empty: anything of the user's stays
            except OSError:
                break
    out += _remove_apparmor_rule(paths)
    return out


def status(root: str) -> tuple[bool, list[str]]:
    """(installed and usable, a description line by line)."""
    paths = Paths(root)
    text = _read(paths.hook)
    lines, ok = [], False
    if text is None:
        lines.append(f"hook: not installed ({paths.hook} is missing)")
    elif MARKER not in text:
        lines.append(f"hook: {paths.hook} exists but is not ours")
    else:
        python = re.search(r"^exec (\S+)", text, re.M)
        interpreter = shlex.split(python.group(1))[0] if python else "?"
        ok = os.access(paths.hook, os.X_OK) and os.access(interpreter, os.X_OK)
        lines.append(f"hook: {paths.hook} ({'ok' if ok else 'NOT usable: not executable or interpreter missing'})")
        for name in ("ORION_SERVER_CONF", "ORION_PID_FILE"):
            value = re.search(rf"^{name}=(.*?); export", text, re.M)
            lines.append(f"  {name}={shlex.split(value.group(1))[0] if value else '(default)'}")
        lines.append(f"  interpreter {interpreter}")
    if os.path.lexists(paths.qemu_hook):
        lines.append(f"other hook: {paths.qemu_hook} (libvirt runs it before ours)")
    others = sorted(set(_executables(paths.hook_dir)) - {HOOK_NAME})
    if others:
        lines.append(f"other hooks in {paths.hook_dir}: {', '.join(others)}")
    if text is not None and MARKER in text:
        seen, line = libvirtd_runs_hooks(paths)
        ok = ok and seen is not False
        lines.append(line)
    apparmor = _apparmor_target(paths)
    if apparmor is None:
        lines.append("apparmor: not active; no rule needed")
    else:
        present = RULE_BEGIN in (_read(apparmor) or "")
        ok = ok and present
        lines.append(f"apparmor: active; Orion rule {'present' if present else 'MISSING'} in {apparmor}")
    return ok, lines


# --- checks -------------------------------------------------------------------------------------------------
def _check_interpreter(python: str) -> None:
    """The hook is useless if its interpreter cannot import it: check now rather than at a domain's start."""
    try:
        result = subprocess.run([python, "-I", "-c", "import libvirt_hooks.qemu_hook, libvirt_hooks.regions"],
                                capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise InstallError(f"cannot run {python}: {exc.strerror}; give the project's interpreter with "
                           "--python") from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["?"])[-1]
        raise InstallError(f"{python} cannot import the hook ({last}); give the interpreter of the environment "
                           "where the project is installed with --python")


def _check_libvirt_version() -> None:
    """libvirt older than 6.5 runs only hooks/qemu, never qemu.d/: refuse rather than install a dead hook."""
    for daemon in ("libvirtd", "virtqemud"):
        if shutil.which(daemon) is None:
            continue
        try:
            text = subprocess.run([daemon, "--version"], capture_output=True, text=True, timeout=30).stdout
        except OSError:
            continue
        match = re.search(r"(\d+)\.(\d+)\.\d+", text)
        if match and (int(match.group(1)), int(match.group(2))) < MIN_LIBVIRT:
            raise InstallError(f"libvirt {match.group(0)} runs only /etc/libvirt/hooks/qemu, not qemu.d/ (6.5 and "
                               "later do); upgrade libvirt, or call the Orion hook from your qemu hook by hand "
                               "(docs/kvm.md)")
        return


def _settings(config: str) -> ShmSettings:
    try:
        return ShmSettings.load(config)
    except ConfigError as exc:
        raise InstallError(str(exc)) from None


def _libvirt_sees_qemu_hooks(paths: Paths) -> bool:
    """Whether a running libvirtd already found a qemu hook when it started (then it needs no restart)."""
    qemu = paths.qemu_hook
    return (os.path.isfile(qemu) and os.access(qemu, os.X_OK)) or bool(_executables(paths.hook_dir))


def restart_advice(paths: Paths, pid: int | None = None) -> str:
    """How to restart libvirtd on this host: `systemctl` only where systemd runs (it is PID 1 exactly when
    /run/systemd/system exists, as sd_booted() checks); elsewhere (containers, CI) the daemon runs as itself."""
    if os.path.isdir(paths.at(SYSTEMD_RUNNING)):
        return "systemctl restart libvirtd, or virtqemud where the modular daemons run"
    target = str(pid) if pid is not None else f'"$(cat /{LIBVIRTD_PID_FILE})"'
    return (f"no systemd here: kill {target}, wait until it has exited, then start it again with 'libvirtd -d'; "
            "'sudo ./setup.sh --no-demo' does exactly that")


def libvirtd_runs_hooks(paths: Paths) -> tuple[bool | None, str]:
    """Whether the running libvirtd will run qemu hooks (True/False; None when no libvirtd runs), and a line.

    libvirtd decides once, when it starts (virHookInitialize in its main()): hooks run only if a qemu hook was
    there then. So it runs ours if our file appeared before that moment (an update keeps the file's time), or
    if some other qemu hook it still has did.

    "That moment" is bounded by the daemon's pid file: main() writes it (virPidFileAcquirePath) before it
    looks for hooks, so a hook whose mtime is not after the pid file's mtime was there when libvirtd looked.
    Both are file times stamped by the same kernel clock, compared in nanoseconds, so the comparison needs
    no conversion. The process start time from /proc/PID/stat is not used: it counts clock ticks since boot,
    and /proc/stat's `btime` is whole seconds, so the start computed from them can be up to a second early
    (a libvirtd started 0.03 s after the hook looked older than it: issue 11). Only a hook written during
    the few milliseconds between the pid file and the hook scan of a daemon starting at that very moment
    could be judged wrongly; a clock stepped back between the two writes errs towards a needless restart."""
    pid = _running_daemon(paths)
    if pid is None:
        return None, "libvirtd: not running; it will run the hook when it starts"
    hooks = [paths.qemu_hook] if os.path.isfile(paths.qemu_hook) and os.access(paths.qemu_hook, os.X_OK) else []
    hooks += [os.path.join(paths.hook_dir, name) for name in _executables(paths.hook_dir)]
    try:
        first = min(os.stat(hook).st_mtime_ns for hook in hooks)
    except (ValueError, OSError):
        return False, f"libvirtd: pid {pid} runs no qemu hook; restart it ({restart_advice(paths, pid)})"
    looked = _hook_scan_bound(paths)
    if looked is not None and looked >= first:
        return True, f"libvirtd: pid {pid} runs qemu hooks"
    return False, (f"libvirtd: pid {pid} started before any qemu hook was installed, so it runs none: restart it "
                   f"({restart_advice(paths, pid)})")


def _running_daemon(paths: Paths) -> int | None:
    """The pid of the running libvirtd (from its pid file), or None."""
    try:
        pid = int((_read(paths.at(LIBVIRTD_PID_FILE)) or "").strip())
        comm = _read(paths.at(f"proc/{pid}/comm"))
    except ValueError:
        return None
    return pid if comm is not None and comm.strip() == "libvirtd" else None


def _hook_scan_bound(paths: Paths) -> int | None:
    """The libvirtd pid file's mtime in ns: the running daemon looked for hooks after this (None: no file)."""
    try:
        return os.stat(paths.at(LIBVIRTD_PID_FILE)).st_mtime_ns
    except OSError:
        return None


def _executables(directory: str) -> list[str]:
    """The names libvirt would run from `directory`: executable regular files directly in it."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    return [e.name for e in entries if e.is_file() and os.access(e.path, os.X_OK)]


# --- AppArmor -----------------------------------------------------------------------------------------------
def _apparmor_target(paths: Paths) -> str | None:
    """The file our rule goes in, or None where AppArmor is not active or libvirt's abstraction is missing."""
    enabled = (_read(paths.at(APPARMOR_ENABLED)) or "").strip()
    abstraction = _read(paths.at(ABSTRACTION))
    if not enabled.startswith("Y") or abstraction is None:
        return None
    if re.search(r"^\s*#?include\s+(if exists\s+)?<local/abstractions/libvirt-qemu>", abstraction, re.M):
        return paths.at(LOCAL_ABSTRACTION)
    return paths.at(ABSTRACTION)


def _rule_block(settings: ShmSettings) -> str:
    base = settings.path_base.rstrip("/") or ""
    return f"{RULE_BEGIN}\n{base}/orionsock* rw,\n{RULE_END}\n"


def _install_apparmor_rule(paths: Paths, settings: ShmSettings) -> list[str]:
    target = _apparmor_target(paths)
    if target is None:
        return [f"AppArmor is not active here ({paths.at(APPARMOR_ENABLED)} does not say Y, or "
                f"{paths.at(ABSTRACTION)} is missing): no AppArmor rule installed"]
    block = _rule_block(settings)
    current = _read(target) or ""
    if block in current:
        return [f"AppArmor rule already in {target}; nothing changed"]
    text = _without_block(current)
    if text and not text.endswith("\n"):
        text += "\n"
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    _write(target, text + block, 0o644)
    return [f"added the AppArmor rule '{block.splitlines()[1]}' to {target}", *_reload_apparmor(paths)]


def _remove_apparmor_rule(paths: Paths) -> list[str]:
    out = []
    for target in (paths.at(LOCAL_ABSTRACTION), paths.at(ABSTRACTION)):
        current = _read(target)
        if current is not None and RULE_BEGIN in current:
            _write(target, _without_block(current), 0o644)
            out.append(f"removed the AppArmor rule from {target}")
    if out:
        out += _reload_apparmor(paths)
    return out


def _without_block(text: str) -> str:
    return re.sub(rf"^{re.escape(RULE_BEGIN)}\n.*?^{re.escape(RULE_END)}\n?", "", text, flags=re.M | re.S)


def _reload_apparmor(paths: Paths) -> list[str]:
    """Reload the profiles of running domains (libvirt-<uuid>); new domains read the abstraction at start."""
    if paths.root != "/":
        return [f"AppArmor profiles not reloaded (installing under {paths.root})"]
    parser = shutil.which("apparmor_parser")
    profiles = [e.path for e in _scandir(paths.at(DOMAIN_PROFILES))
                if re.fullmatch(r"libvirt-[0-9a-f-]{36}", e.name)]
    if not profiles:
        return ["no running domain has an AppArmor profile to reload; new domains get the rule when they start"]
    if parser is None:
        return ["apparmor_parser is missing: running domains keep their old profile until they restart"]
    failed = [p for p in profiles if subprocess.run([parser, "-r", p], capture_output=True, timeout=60).returncode]
    done = [f"reloaded {len(profiles) - len(failed)} running domain profile(s)"]
    if failed:
        done.append(f"could not reload {', '.join(failed)}: those domains get the rule when they restart")
    return done


# --- files --------------------------------------------------------------------------------------------------
def _scandir(directory: str) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(directory))
    except OSError:
        return []


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _write(path: str, text: str, mode: int, tmp_dir: str | None = None) -> None:
    """Replace `path` atomically: libvirt may run the hook at any moment, and must never see half a file.

    `tmp_dir` (same file system) keeps the temporary file out of a directory whose every file libvirt runs."""
    tmp = os.path.join(tmp_dir or os.path.dirname(path), f".{os.path.basename(path)}.orion-hooks.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
