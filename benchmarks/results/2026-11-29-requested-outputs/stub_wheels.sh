# The stub environment's numpy<2 wheel travels unzipped in a tar.xz (9 MB against the wheel's 18):
# rebuild the wheel in /tmp/stub-wheels.
[ -f /tmp/stub-wheels/$(cat .device/stub-numpy-name) ] && exit 0
rm -rf /tmp/npw && mkdir -p /tmp/npw /tmp/stub-wheels && tar -xJf .device/stub-numpy.tar.xz -C /tmp/npw || exit 1
(cd /tmp/npw && python3 -m zipfile -c /tmp/stub-wheels/$(cat "$OLDPWD/.device/stub-numpy-name") *)
