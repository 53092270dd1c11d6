# Runs in the image's chroot: Debian's Python 3.11 and libpq (for psycopg's pure-Python
# implementation), and the app that e2e/apps/python/build.sh wrote into /tmp/context on the host
# (app.py and, in lib/, the pinned packages built for this Python).
apt-get update -qq
apt-get install -y -qq --no-install-recommends python3 libpq5 >/dev/null
groupadd --gid 1000 app
useradd --uid 1000 --gid 1000 --home-dir /opt/app --shell /usr/sbin/nologin app
mkdir -p /opt/app
cp -a /tmp/context/. /opt/app/
# Bytecode now, by root: the app runs with a read-only /opt/app.
python3 -m compileall -q -j 0 /opt/app >/dev/null
# Nothing reads these at run time: about 50 MB less.
rm -rf /usr/share/doc/* /usr/share/man/* /usr/share/info/* /usr/share/locale/*
chown -R root:root /opt/app
chmod -R a+rX,go-w /opt/app
cd /opt/app
PYTHONPATH=/opt/app/lib python3 -c '
import sys, psycopg, pika, pymongo, pymongo.errors, pyservicebinding.binding, app
assert psycopg.pq.__impl__ == "python", psycopg.pq.__impl__
assert pymongo.has_c(), "pymongo C extensions did not load"
print("python app image ok: python", sys.version.split()[0], "libpq", psycopg.pq.version(),
      "psycopg", psycopg.__version__, "pika", pika.__version__, "pymongo", pymongo.__version__)'
