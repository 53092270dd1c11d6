# Runs in the image's chroot: RabbitMQ with the official image's uid, paths and plugins.
groupadd -r rabbitmq --gid=999
useradd -r -g rabbitmq --uid=999 --home-dir=/var/lib/rabbitmq --shell=/bin/bash rabbitmq
apt-get update -qq
apt-get install -y -qq --no-install-recommends gosu rabbitmq-server procps >/dev/null
mkdir -p /var/lib/rabbitmq /etc/rabbitmq /etc/rabbitmq/conf.d /var/log/rabbitmq
# As the official image: management and Prometheus plugins on, logs to stdout.
rabbitmq-plugins enable --offline rabbitmq_management rabbitmq_prometheus
printf 'loopback_users.guest = false\nlisteners.tcp.default = 5672\nmanagement.tcp.port = 15672\n' \
  >/etc/rabbitmq/conf.d/10-defaults.conf
chown -R rabbitmq:rabbitmq /var/lib/rabbitmq /etc/rabbitmq /var/log/rabbitmq
chmod 1777 /var/lib/rabbitmq /etc/rabbitmq /etc/rabbitmq/conf.d /var/log/rabbitmq
ln -sf /var/lib/rabbitmq/.erlang.cookie /root/.erlang.cookie
chmod 0755 /usr/local/bin/docker-entrypoint.sh
dpkg-query -W rabbitmq-server
