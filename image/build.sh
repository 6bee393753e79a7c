#!/bin/sh
# image/build.sh — assembles the cozygpu OCI image archive from Debian 12
# packages alone (no other registry, no container daemon). `make image`
# runs it; by hand:
#
#   VERSION=0.1.0 REVISION=abc1234 image/build.sh BINARY OUT.tar WORKDIR
#
# (environment: VERSION, REVISION, IMAGE_NAME, IMAGE_SOURCE, IMAGE_MIRROR,
# IMAGE_LIBDIR, IMAGE_POLICYDIR, SOURCE_DATE_EPOCH; image/image.mk sets them.)
#
# How, and why this way:
#
# 1. mmdebstrap --variant=essential makes a staging Debian 12 root with the
#    runtime packages installed as usual (maintainer scripts run, so
#    ca-certificates builds its bundle). It is never shipped.
# 2. The final root starts empty and receives only what the binary needs:
#    the shared objects of its ELF dependency closure (readelf NEEDED,
#    followed recursively, found in the staging root), the dynamic loader,
#    the CA bundle, libpci's pci.ids, lua/ and policies/, passwd/group
#    naming the non-root user 65532, and the copyright file and dpkg status
#    stanza of every package a file came from (data for license review and
#    vulnerability scanners; no dpkg program). Copying files into an empty
#    root, rather than deleting from a Debian root, makes the contents a
#    list this script states: no shell, no package manager, nothing left
#    behind by a removal that missed a file.
# 3. umoci puts that root into an OCI layout as one layer, sets the config
#    (user, entrypoint, PATH, labels) and the archive is that layout tarred
#    (an oci-archive).
#
# The binary writes only under --state-dir (the controller, default $TMPDIR
# or /tmp) and to the host sysfs it is given (the agent), so the image runs
# with a read-only root filesystem and a tmpfs or emptyDir on /tmp.
set -eu
umask 022

die() { echo "image: $*" >&2; exit 1; }

[ $# -eq 3 ] || die "usage: image/build.sh BINARY OUT.tar WORKDIR"
bin=$1 out=$2 work=$3
: "${VERSION:?image: VERSION is not set (make image sets it from the VERSION file)}"
REVISION=${REVISION:-unknown}
IMAGE_NAME=${IMAGE_NAME:-ghcr.io/cozystack/cozygpu}
IMAGE_SOURCE=${IMAGE_SOURCE:-https://github.com/cozystack/cozygpu}
IMAGE_MIRROR=${IMAGE_MIRROR:-http://deb.debian.org/debian}
IMAGE_LIBDIR=${IMAGE_LIBDIR:-/usr/share/cozygpu/lua}
IMAGE_POLICYDIR=${IMAGE_POLICYDIR:-/usr/share/cozygpu/policies}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(date +%s)}
export SOURCE_DATE_EPOCH

[ -x "$bin" ] || die "$bin: no such binary (make image builds it first)"
for t in mmdebstrap umoci readelf strip tar gzip; do
    command -v $t >/dev/null 2>&1 || die "$t is not installed (make image-deps installs it)"
done
[ -d lua ] && [ -d policies ] || die "run from the repository root (lua/ and policies/ not found)"

# the runtime packages: the libraries the binary links (and, through them,
# theirs), the CA bundle and libpci's PCI ID database
PACKAGES=liblua5.4-0,libjansson4,libyajl2,libyaml-0-2,libcurl4,libmicrohttpd12,libgnutls30,libpci3,pci.ids,ca-certificates
# what `make image` links against must be what the image carries
readelf -d "$bin" | grep -q 'Shared library: \[libcurl\.so\.4\]' ||
    die "$bin does not link libcurl.so.4 (libcurl4): update PACKAGES in image/build.sh"

triplet=$(gcc -print-multiarch 2>/dev/null || true)
[ -n "$triplet" ] || triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || true)
[ -n "$triplet" ] || die "cannot tell the multiarch triplet (gcc -print-multiarch)"
arch=$(dpkg --print-architecture)
interp=$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)\]$/\1/p')
[ -n "$interp" ] || die "$bin has no program interpreter (not a dynamic executable?)"

rm -rf "$work"
mkdir -p "$work"
stage=$work/staging root=$work/rootfs oci=$work/oci bundle=$work/bundle
ref="$IMAGE_NAME:$VERSION"

# ---- 1. the staging root ------------------------------------------------
echo "image: staging root (mmdebstrap bookworm from $IMAGE_MIRROR)"
mmdebstrap --quiet --variant=essential --format=tar --include="$PACKAGES" \
    bookworm "$work/staging.tar" "$IMAGE_MIRROR" ||
    die "mmdebstrap failed (messages above); it downloads from $IMAGE_MIRROR: is that mirror reachable (network, proxy)?"
mkdir -p "$stage"
tar -C "$stage" --exclude=./dev -xf "$work/staging.tar" ||
    die "could not extract the staging root $work/staging.tar"
rm -f "$work/staging.tar"
[ -d "$stage/usr/lib/$triplet" ] || die "staging root has no /usr/lib/$triplet (architecture mismatch?)"

# ---- 2. the final root --------------------------------------------------
libdir=usr/lib/$triplet
mkdir -p "$root/usr/bin" "$root/$libdir" "$root/etc/ssl/certs" "$root/usr/share/misc" \
    "$root/usr/share/cozygpu" "$root/usr/share/doc" "$root/var/lib/dpkg/status.d" "$root/tmp"
chmod 1777 "$root/tmp"
# merged /usr, as Debian 12: /lib and /lib64 are links into /usr
ln -s usr/lib "$root/lib"

strip --strip-unneeded -o "$root/usr/bin/cozygpu" "$bin" || die "strip $bin failed"
cp -R lua "$root$IMAGE_LIBDIR"
cp -R policies "$root$IMAGE_POLICYDIR"

# The ELF closure: NEEDED entries, followed until no new one appears. Every
# one must be found in the staging root.
owners=$work/owners
: >"$owners"
find_lib() {
    for d in "usr/lib/$triplet" "lib/$triplet" usr/lib lib; do
        [ -e "$stage/$d/$1" ] && { echo "$d/$1"; return 0; }
    done
    return 1
}
queue=$(readelf -d "$bin" | sed -n 's/.*Shared library: \[\(.*\)\]$/\1/p')
seen=" "
while [ -n "$queue" ]; do
    next=""
    for so in $queue; do
        case "$seen" in *" $so "*) continue ;; esac
        seen="$seen$so "
        rel=$(find_lib "$so") || die "$so (needed by the binary or one of its libraries) is not in the staging root: add its package to PACKAGES in image/build.sh"
        cp -L "$stage/$rel" "$root/$libdir/$so"
        echo "$so" >>"$owners"
        next="$next $(readelf -d "$stage/$rel" | sed -n 's/.*Shared library: \[\(.*\)\]$/\1/p')"
    done
    queue=$next
done
# the loader at the path the binary names (e.g. /lib64/ld-linux-x86-64.so.2)
iname=${interp##*/} idir=${interp%/*}
[ -f "$root/$libdir/$iname" ] || die "the loader $iname is not among the libraries copied"
case "$idir" in
/lib) ;; # /lib -> usr/lib already
/lib64)
    mkdir -p "$root/usr/lib64"
    ln -s usr/lib64 "$root/lib64"
    ln -s "../lib/$triplet/$iname" "$root/usr/lib64/$iname"
    ;;
*) die "unexpected loader directory $idir" ;;
esac
[ "$idir" = /lib ] && ln -s "$triplet/$iname" "$root/usr/lib/$iname"

[ -s "$stage/etc/ssl/certs/ca-certificates.crt" ] || die "the staging root has no CA bundle (ca-certificates)"
cp "$stage/etc/ssl/certs/ca-certificates.crt" "$root/etc/ssl/certs/"
[ -s "$stage/usr/share/misc/pci.ids" ] || die "the staging root has no /usr/share/misc/pci.ids (pci.ids)"
cp "$stage/usr/share/misc/pci.ids" "$root/usr/share/misc/"

cp "$stage/usr/lib/os-release" "$root/usr/lib/os-release"
ln -s ../usr/lib/os-release "$root/etc/os-release"
cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
nonroot:x:65532:
GROUP
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"

# the packages the files came from: their copyright and status stanza
pkgs=$(
    while read -r so; do
        dpkg-query --admindir="$stage/var/lib/dpkg" -S "*/$so" 2>/dev/null | sed -n '1s/[:,].*//p'
    done <"$owners"
    echo ca-certificates
    echo pci.ids
)
for p in $(echo "$pkgs" | sort -u); do
    p=${p%%:*}
    [ -f "$stage/usr/share/doc/$p/copyright" ] || die "no copyright file for package $p"
    mkdir -p "$root/usr/share/doc/$p"
    cp "$stage/usr/share/doc/$p/copyright" "$root/usr/share/doc/$p/"
    dpkg-query --admindir="$stage/var/lib/dpkg" -s "$p" >"$root/var/lib/dpkg/status.d/$p" ||
        die "dpkg-query -s $p failed in the staging root"
done
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
rm -rf "$stage" # about 170 MB; $root stays for inspection

# ---- 3. the OCI image ---------------------------------------------------
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
echo "image: OCI layout ($ref)"
umoci init --layout "$oci"
umoci new --image "$oci:$ref"
umoci unpack --rootless --image "$oci:$ref" "$bundle" >/dev/null
cp -a "$root/." "$bundle/rootfs/"
umoci repack --image "$oci:$ref" --history.created="$created" \
    --history.created_by="image/build.sh (cozygpu $VERSION, revision $REVISION)" "$bundle"
rm -rf "$bundle"
set -- \
    org.opencontainers.image.title=cozygpu \
    "org.opencontainers.image.description=cozygpu: GPUs as a tenant resource on KubeVirt (controller and node agent)" \
    org.opencontainers.image.version="$VERSION" \
    org.opencontainers.image.revision="$REVISION" \
    org.opencontainers.image.source="$IMAGE_SOURCE" \
    org.opencontainers.image.created="$created"
# one option per line of $cfg: split on newlines only
IFS='
'
cfg="--config.user=65532:65532
--config.entrypoint=/usr/bin/cozygpu
--config.cmd=--help
--config.env=PATH=/usr/local/bin:/usr/bin
--config.workingdir=/
--architecture=$arch
--os=linux
--created=$created
--author=cozystack"
for kv in "$@"; do
    cfg="$cfg
--config.label=$kv
--manifest.annotation=$kv"
done
# shellcheck disable=SC2086 # one option per line
umoci config --image "$oci:$ref" --history.created="$created" \
    --history.created_by="image/build.sh: user, entrypoint, labels" $cfg
unset IFS
umoci gc --layout "$oci"
# docker load names the image after io.containerd.image.name, podman and
# skopeo after org.opencontainers.image.ref.name: give the index both
sed -i "s|\"org.opencontainers.image.ref.name\":\"$ref\"|\"io.containerd.image.name\":\"$ref\",&|" "$oci/index.json"
grep -q '"io.containerd.image.name"' "$oci/index.json" || die "could not annotate $oci/index.json with the image name"

mkdir -p "$(dirname "$out")"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    -C "$oci" -cf "$out.tmp" oci-layout index.json blobs
mv "$out.tmp" "$out"

# ---- what it weighs -----------------------------------------------------
layer=$(find "$oci/blobs" -type f -printf '%s\n' | sort -n | tail -1)
total=$(stat -c %s "$out")
unpacked=$(du -sk "$root" | cut -f1)
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1048576 }'; }
echo "image: $out ($ref, revision $REVISION)"
echo "image: compressed layer $(mb "$layer"), archive $(mb "$total"), unpacked $(mb $((unpacked * 1024)))"
echo "image: largest files and folders (KiB, unpacked; the root is $root):"
(cd "$root" && du -ak . | sort -rn | awk '$1 >= 200' | head -20 | sed 's/^/  /')
