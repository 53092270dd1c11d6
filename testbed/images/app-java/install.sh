# Runs in the image's chroot: Debian's Java 17 runtime and the application that e2e/apps/java's
# build.sh built on the host (in /tmp/context: binding-app.jar and lib/).
apt-get update -qq
apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null
groupadd --gid 1000 app
useradd --uid 1000 --gid 1000 --home-dir /opt/app --shell /usr/sbin/nologin app
mkdir -p /opt/app
cp -a /tmp/context/. /opt/app/
chown -R root:root /opt/app
chmod -R a+rX,go-w /opt/app
# The JVM's flags as config.json's Entrypoint gives them: an archive is used only by a JVM like
# the one that made it (same JDK build, same class path, same files).
java_flags=(-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData -Dspring.aot.enabled=true)
# AppCDS: a training run that refreshes the Spring context and exits (no server started, no
# binding read) leaves the classes it loaded in app.jsa; the pod then starts with them mapped.
(cd /opt/app && java -XX:ArchiveClassesAtExit=/opt/app/app.jsa "${java_flags[@]}" \
  -Dspring.context.exit=onRefresh -jar /opt/app/binding-app.jar >/tmp/training.log 2>&1) ||
  { cat /tmp/training.log; exit 1; }
chmod a+r /opt/app/app.jsa
# Smoke check: as the app user, with the archive required (-Xshare:on fails without it), the
# server answers /healthz (the chroot shares the host's network: a random high port).
port=$((20000 + RANDOM % 20000))
(cd /opt/app && exec setpriv --reuid=1000 --regid=1000 --clear-groups java -Xshare:on \
  -XX:SharedArchiveFile=/opt/app/app.jsa "${java_flags[@]}" -Dserver.port=$port -jar /opt/app/binding-app.jar) \
  >/tmp/smoke.log 2>&1 &
app=$!
reply=""
for _ in $(seq 60); do
  reply=$( (exec 3<>/dev/tcp/127.0.0.1/$port && printf 'GET /healthz HTTP/1.0\r\n\r\n' >&3 && cat <&3) 2>/dev/null) && break
  sleep 0.5
done
kill "$app"
wait "$app" || true
grep -q "^HTTP/1.1 200 OK" <<<"$reply" || { cat /tmp/smoke.log; echo "no answer from /healthz"; exit 1; }
echo "app-java image ok ($(java -version 2>&1 | head -n1))"
