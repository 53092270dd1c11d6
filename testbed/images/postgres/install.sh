# Runs in the image's chroot. PG_MAJOR comes from image.conf.
# The official image's user, so volumes written by either image stay readable.
groupadd -r postgres --gid=999
useradd -r -g postgres --uid=999 --home-dir=/var/lib/postgresql --shell=/bin/bash postgres
install -d -o postgres -g postgres -m 0755 /var/lib/postgresql
apt-get update -qq
apt-get install -y -qq --no-install-recommends gosu locales tzdata libnss-wrapper xz-utils zstd >/dev/null
localedef -i en_US -c -f UTF-8 -A /usr/share/locale/locale.alias en_US.UTF-8
# The image's entrypoint creates the cluster, not the package's postinst.
mkdir -p /etc/postgresql-common/createcluster.d
echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.d/statefleet.conf
apt-get install -y -qq --no-install-recommends "postgresql-$PG_MAJOR" "postgresql-client-$PG_MAJOR" >/dev/null
sed -ri "s!^#?(listen_addresses)\s*=\s*\S+.*!\1 = '*'!" "/usr/share/postgresql/$PG_MAJOR/postgresql.conf.sample"
grep -F "listen_addresses = '*'" "/usr/share/postgresql/$PG_MAJOR/postgresql.conf.sample"
install -d -o postgres -g postgres -m 3777 /var/run/postgresql
install -d -o postgres -g postgres -m 1777 /var/lib/postgresql/data
mkdir -p /docker-entrypoint-initdb.d
chmod 0755 /usr/local/bin/docker-entrypoint.sh
"/usr/lib/postgresql/$PG_MAJOR/bin/postgres" --version
