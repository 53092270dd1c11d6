# Runs in the image's chroot: Debian's Node.js and the app that e2e/apps/node/build.sh wrote
# into /tmp/context on the host (app.js and its node_modules, pure JavaScript).
apt-get update -qq
apt-get install -y -qq --no-install-recommends nodejs >/dev/null
groupadd --gid 1000 app
useradd --uid 1000 --gid 1000 --home-dir /opt/app --shell /usr/sbin/nologin app
mkdir -p /opt/app
cp -a /tmp/context/. /opt/app/
chown -R root:root /opt/app
chmod -R a+rX,go-w /opt/app
cd /opt/app
node --check app.js
node -e 'for (const m of ["kube-service-bindings", "pg", "amqplib", "mongodb"]) require(m);
  console.log(`node app image ok: node ${process.version}`)'
