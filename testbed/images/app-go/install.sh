# Runs in the image's chroot: the static binary built on the host (/tmp/context). Nothing from
# apt: the base already has ca-certificates, and the app trusts only its bindings' CAs anyway.
groupadd --gid 1000 app
useradd --uid 1000 --gid 1000 --home-dir /opt/app --shell /usr/sbin/nologin app
install -d -o root -g root -m 0755 /opt/app
cp -a /tmp/context/. /opt/app/
chown -R root:root /opt/app
chmod 0755 /opt/app/binding-app
# A static Go binary reads no translations, manuals or docs (the copyright files stay): -40 MB.
rm -rf /usr/share/locale/* /usr/share/man/*
find /usr/share/doc -type f ! -name copyright -delete
# Smoke check: it starts as the app user and answers /healthz (an unlikely port: the chroot
# shares the build host's network).
SERVICE_BINDING_ROOT=/bindings setpriv --reuid 1000 --regid 1000 --clear-groups \
  /opt/app/binding-app -listen 127.0.0.1:18473 >/tmp/smoke.log 2>&1 &
smoke=$!
for _ in $(seq 50); do
  if { exec 3<>/dev/tcp/127.0.0.1/18473; } 2>/dev/null; then
    printf 'GET /healthz HTTP/1.0\r\n\r\n' >&3
    answer=$(cat <&3)
    exec 3<&-
    break
  fi
  sleep 0.1
done
kill "$smoke"
wait "$smoke" || true
[[ ${answer:-} == *$'\r\n\r\nok' ]] || { echo "smoke check failed: ${answer:-no answer}"; cat /tmp/smoke.log; exit 1; }
echo "go app image ok"
