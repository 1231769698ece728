#!/usr/bin/env bash
# The code a device carries to sync over HTTPS, per transport, on aarch64 (docs/sdk.md, "Transports"): size(1) of
#   1. the transport's own code: libdprec_transport_mbedtls.a, and platform/curl/transport_curl.c compiled for aarch64
#      against Debian's arm64 libcurl headers, at -O3 and -Os;
#   2. the shared libraries it brings beyond the SDK's own libmbedcrypto and libc: libmbedtls and libmbedx509 for the
#      mbedTLS transport (the :arm64 packages scripts/setup.sh installs), and libcurl with everything it needs for
#      the libcurl transport (libcurl4:arm64 and its dependencies, which `apt-get download` fetches into a scratch
#      directory: they are not installed, because they do not install beside the native ones, docs/sdk.md);
#   3. what the mbedTLS transport adds to a statically linked device program (-Os, --gc-sections): one that verifies
#      a release and one that also syncs through the transport (no such static build exists for libcurl's closure).
#   bash bench/transport_size.sh [WORK_DIR]      (default build-transport-size; needs network for step 2)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
work=$(realpath -m "${1:-build-transport-size}")
sz=aarch64-linux-gnu-size
cc=aarch64-linux-gnu-gcc
multi=/usr/lib/aarch64-linux-gnu
command -v $sz > /dev/null && command -v $cc > /dev/null || { echo "transport_size.sh: needs the aarch64 cross tools (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$work"
text() { "$sz" -t "$@" | tail -1 | awk '{print $1}'; }      # total text of archives/objects
textdata() { "$sz" "$1" | tail -1 | awk '{print $1 + $2}'; }  # text + data of one shared library

echo "## 1. the transport's own code (aarch64, gcc $($cc -dumpfullversion), size(1) text)"
echo "| transport | Release (-O3) | MinSizeRel (-Os) |"
echo "|---|---|---|"
declare -A own
for type in Release MinSizeRel; do
  d="$work/aarch64-$type"
  cmake -S . -B "$d" -DCMAKE_TOOLCHAIN_FILE=toolchains/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=$type \
        -DDPREC_SDK_ONLY=ON -DDPREC_BUILD_JNI=OFF > /dev/null
  cmake --build "$d" -j2 --target dprec dprec_port_posix dprec_transport_mbedtls > /dev/null
  own[mbedtls-$type]=$(text "$d/platform/mbedtls/libdprec_transport_mbedtls.a")
done

# libcurl for arm64, not installed: its packages and their dependencies, downloaded and unpacked
debs="$work/curl-arm64"
if [ ! -f "$debs/.done" ]; then
  rm -rf "$debs" && mkdir -p "$debs/root"
  (cd "$debs" && apt-get download -q libcurl4:arm64 libcurl4-openssl-dev:arm64 libssl3:arm64 libbrotli1:arm64 \
     libgssapi-krb5-2:arm64 libidn2-0:arm64 libldap-2.5-0:arm64 libnghttp2-14:arm64 libpsl5:arm64 librtmp1:arm64 \
     libssh2-1:arm64 libzstd1:arm64 zlib1g:arm64 libkrb5-3:arm64 libk5crypto3:arm64 libkrb5support0:arm64 \
     libcom-err2:arm64 libkeyutils1:arm64 libsasl2-2:arm64 libgnutls30:arm64 libhogweed6:arm64 libnettle8:arm64 \
     libgmp10:arm64 libp11-kit0:arm64 libtasn1-6:arm64 libunistring2:arm64 libffi8:arm64 > /dev/null 2>&1)
  for f in "$debs"/*.deb; do dpkg-deb -x "$f" "$debs/root"; done
  touch "$debs/.done"
fi
croot="$debs/root"
for type in Release MinSizeRel; do
  flag=$([ $type = Release ] && echo -O3 || echo -Os)
  $cc $flag -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude -Icommon -I"$croot/usr/include/aarch64-linux-gnu" \
      -c platform/curl/transport_curl.c -o "$work/transport_curl-$type.o"
  own[curl-$type]=$(text "$work/transport_curl-$type.o")
done
echo "| mbedTLS (platform/mbedtls) | ${own[mbedtls-Release]} | ${own[mbedtls-MinSizeRel]} |"
echo "| libcurl (platform/curl) | ${own[curl-Release]} | ${own[curl-MinSizeRel]} |"
echo

echo "## 2. the shared libraries each brings beyond libmbedcrypto and libc (Debian 12 arm64, size(1) text + data)"
libc_set=" libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 libresolv.so.2 ld-linux-aarch64.so.1 "
closure() { # root dir, library file name: that library and every library it needs, found under root, once each
  local root=$1 seen=" " queue=("$2") lib path need
  while [ ${#queue[@]} -gt 0 ]; do
    lib=${queue[0]}; queue=("${queue[@]:1}")
    case "$seen$libc_set" in *" $lib "*) continue ;; esac
    seen="$seen$lib "
    path=$(find "$root" -name "$lib" \( -type f -o -type l \) | head -1)
    [ -n "$path" ] || { echo "transport_size.sh: $lib not found under $root" >&2; continue; }
    echo "$(readlink -f "$path")"
    for need in $(readelf -d "$path" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do queue+=("$need"); done
  done
}
total_of() { local t=0 f; for f in "$@"; do t=$((t + $(textdata "$f"))); done; echo $t; }
mapfile -t mb < <(closure "$multi" libmbedtls.so.14 | grep -v libmbedcrypto)
mapfile -t cu < <(closure "$croot" libcurl.so.4)
echo "| transport | libraries | text + data |"
echo "|---|---|---|"
echo "| mbedTLS | $(for f in "${mb[@]}"; do basename "$f"; done | tr '\n' ' ')| $(total_of "${mb[@]}") |"
echo "| libcurl, as Debian builds it | ${#cu[@]} libraries: $(for f in "${cu[@]}"; do basename "$f" | sed 's/\.so.*//'; done | tr '\n' ' ')| $(total_of "${cu[@]}") |"
core=()
for f in "${cu[@]}"; do case $(basename "$f") in libcurl.so*|libssl.so*|libcrypto.so*|libz.so*) core+=("$f") ;; esac; done
echo "| libcurl at its least (a build with OpenSSL and zlib only; Debian's libraries measured) | libcurl libssl libcrypto libz | $(total_of "${core[@]}") |"
echo

echo "## 3. what the mbedTLS transport adds to a static device program (aarch64, -Os, --gc-sections, size(1) text)"
cat > "$work/app.c" <<'EOF'
#include <stdio.h>
#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#include "dprec/sync.h"
#ifdef WITH_SYNC
#include "dprec/transport_mbedtls.h"
#endif
#ifdef WITH_OWN_TRANSPORT /* an app's own transport (its platform's HTTPS stack): here one that never connects */
static int fail_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *user,
                        dprec_http_response *resp) {
    (void)ctx; (void)req; (void)sink; (void)user; (void)resp;
    return DPREC_ERR_NETWORK;
}
#endif
int main(int argc, char **argv) {
    dprec_port port; dprec_port_posix posix; dprec_config cfg; dprec_client *c = NULL;
    static unsigned char mem[DPREC_CLIENT_MEMORY_BOUND(1, 1000, 10)], rel[1 << 16], key[128];
    dprec_config_default(&cfg); cfg.num_items = 20; cfg.dim = 1;
    int rc = dprec_port_posix_init(&port, &posix, argc > 1 ? argv[1] : "/tmp/app");
    if (rc == 0) rc = dprec_client_init(&c, &cfg, &port, mem, sizeof mem);
    if (rc == 0) rc = dprec_store_load(c);
    dprec_verify_config vc; dprec_verify_config_init(&vc); vc.release_key = key; vc.release_key_len = sizeof key;
    if (rc == 0) rc = dprec_release_verify(c, rel, sizeof rel, &vc, NULL);
#ifdef WITH_OWN_TRANSPORT
    dprec_transport t; DPREC_STRUCT_INIT(&t); t.request = fail_request;
    dprec_sync_config sc; DPREC_STRUCT_INIT(&sc); sc.job_id = 1; sc.release_key = key; sc.release_key_len = 91;
    dprec_sync_result r; rc = dprec_client_sync(c, &t, &sc, &r);
#endif
#ifdef WITH_SYNC
    dprec_net net; dprec_transport t; dprec_transport_mbedtls tls; dprec_mbedtls_options o;
    DPREC_STRUCT_INIT(&o); o.ca_file = argc > 2 ? argv[2] : NULL; o.pinned_public_key = argc > 3 ? argv[3] : NULL;
    dprec_net_posix_init(&net, &posix);
    if (dprec_transport_mbedtls_init(&t, &tls, "https://127.0.0.1:8443", &port, &net, &o) == 0) {
        dprec_sync_config sc; DPREC_STRUCT_INIT(&sc); sc.job_id = 1; sc.release_key = key; sc.release_key_len = 91;
        dprec_sync_result r; rc = dprec_client_sync(c, &t, &sc, &r);
        dprec_transport_mbedtls_cleanup(&tls);
    }
#endif
    dprec_client_free(c);
    printf("%d\n", rc);
    return 0;
}
EOF
d="$work/aarch64-MinSizeRel"
for v in verify own sync; do
  case $v in verify) def="" ;; own) def=-DWITH_OWN_TRANSPORT ;; sync) def=-DWITH_SYNC ;; esac
  # (glibc warns that a static getaddrinfo needs its shared NSS libraries at run time: this program is only measured)
  $cc -Os -std=c11 -D_POSIX_C_SOURCE=200809L $def -Iinclude -ffunction-sections -fdata-sections "$work/app.c" \
      -static -Wl,--gc-sections -o "$work/app-$v" "$d/platform/mbedtls/libdprec_transport_mbedtls.a" \
      "$d/libdprec_port_posix.a" "$d/libdprec.a" $multi/libmbedtls.a $multi/libmbedx509.a $multi/libmbedcrypto.a -lm \
      2> /dev/null
done
a=$(text "$work/app-verify"); o=$(text "$work/app-own"); b=$(text "$work/app-sync")
echo "| program | text | more than the one above |"
echo "|---|---|---|"
echo "| verifies a release (the SDK, the POSIX port, libmbedcrypto, glibc) | $a | |"
echo "| and syncs through a transport of the app's own (dprec_client_sync) | $o | $((o - a)) |"
echo "| and syncs through the mbedTLS transport instead (its code, mbedTLS's TLS and X.509) | $b | $((b - o)) |"
