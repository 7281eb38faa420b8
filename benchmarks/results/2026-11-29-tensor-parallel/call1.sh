source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32fp8 > /tmp/mk1.log 2>&1 &
python3 -m dsa_backend.tools.make_checkpoint --arch glm_moe_dsa --preset glm5-slice --out /tmp/glm5 > /tmp/mk2.log 2>&1 &
wait; tail -2 /tmp/mk1.log /tmp/mk2.log
python3 .ab/s63/tp_check.py /tmp/v32fp8 /tmp/glm5 > $OUT/tp_check.log 2>&1; echo rc $?
grep -v "^INFO\|DEBUG\|INFO:" $OUT/tp_check.log | tail -90
