# cuda-libs.sh — sourced by the GPU scripts (gpu-check.sh, gpu-lease.sh,
# gpu-experiments.sh): roots, the folders searched for libraries, and
# RPAC_CUDA_LIBS with the folders of the driver, NVRTC and cuBLASLt (the
# Python nvidia-* wheels' included) after any set before.
roots=()
for r in /usr /opt /lib /lib64 /root /home /usr/local/nvidia; do [[ -d $r ]] && roots+=("$r"); done
libdirs="$(find "${roots[@]}" \( -name 'libnvrtc.so*' -o -name 'libcublasLt.so*' -o -name 'libcuda.so.1' \) -not -path "$PWD/*" 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd: -)"
export RPAC_CUDA_LIBS="${RPAC_CUDA_LIBS:+$RPAC_CUDA_LIBS:}$libdirs"
