# Runs in the image's chroot: a venv with the runtime dependencies from pyproject.toml
# (copied in as /tmp/context), installed from PyPI.
apt-get update -qq
apt-get install -y -qq --no-install-recommends python3 python3-venv postgresql-client zstd >/dev/null
groupadd -r statefleet --gid=999
useradd -r -g statefleet --uid=999 --home-dir=/opt/statefleet --shell=/bin/bash statefleet
python3 -m venv /opt/statefleet/venv
/opt/statefleet/venv/bin/pip install --no-cache-dir -q --upgrade pip
/opt/statefleet/venv/bin/python - <<'PY' >/tmp/requirements.txt
import tomllib
with open("/tmp/context", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
/opt/statefleet/venv/bin/pip install --no-cache-dir -q -r /tmp/requirements.txt
chown -R statefleet:statefleet /opt/statefleet
/opt/statefleet/venv/bin/python -c 'import kopf, psycopg, pika, pymongo, boto3, jinja2, pydantic, lightkube; print("python image ok")'
