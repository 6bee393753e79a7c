# image/image.mk — `make image`: build/cozygpu-image.tar, an OCI image
# archive (podman load / docker load / skopeo copy oci-archive:...) made
# from Debian 12 packages alone. image/build.sh assembles it and says why it
# is made the way it is; spec/image/image_spec.lua checks the result.
#
# Included by the top Makefile (VERSION, REVISION, BUILD, deps, check-deps).

# the tools: mmdebstrap (staging root), umoci (OCI layout), binutils (readelf,
# strip), tar and gzip
IMAGE_DEB_PACKAGES := mmdebstrap umoci binutils tar gzip
IMAGE_BUILD     := build/image
IMAGE_TAR       := build/cozygpu-image.tar
# the binary in the image finds its Lua library and default policies here
IMAGE_LIBDIR    := /usr/share/cozygpu/lua
IMAGE_POLICYDIR := /usr/share/cozygpu/policies
IMAGE_NAME      ?= ghcr.io/cozystack/cozygpu
IMAGE_SOURCE    ?= https://github.com/cozystack/cozygpu
IMAGE_MIRROR    ?= http://deb.debian.org/debian

# Install the missing image tools (needs root, or sudo), as `make deps` does.
image-deps:
	@missing=""; for p in $(IMAGE_DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "image-deps: installing$$missing"; \
		if [ "$$(id -u)" -eq 0 ]; then sudo=; elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
		else echo "image-deps: missing Debian packages:$$missing; run 'make image' as root (or install them with apt-get)"; exit 1; fi; \
		$$sudo apt-get -o DPkg::Lock::Timeout=300 update -qq || { echo "image-deps: apt-get update failed: is the Debian mirror reachable (network)?"; exit 1; }; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $$missing \
			|| { echo "image-deps: could not install$$missing (messages above)"; exit 1; }; \
	fi

# The image's binary is built apart (build/image/obj) with the paths inside
# the image compiled in; then image/build.sh makes the archive.
image: deps image-deps
	@$(MAKE) --no-print-directory check-deps
	@$(MAKE) --no-print-directory BUILD=$(IMAGE_BUILD) LIBDIR=$(IMAGE_LIBDIR) POLICYDIR=$(IMAGE_POLICYDIR) \
		$(IMAGE_BUILD)/bin/cozygpu
	VERSION=$(VERSION) REVISION=$(REVISION) IMAGE_NAME=$(IMAGE_NAME) IMAGE_SOURCE=$(IMAGE_SOURCE) \
	IMAGE_MIRROR=$(IMAGE_MIRROR) IMAGE_LIBDIR=$(IMAGE_LIBDIR) IMAGE_POLICYDIR=$(IMAGE_POLICYDIR) \
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || date +%s) \
		image/build.sh $(IMAGE_BUILD)/bin/cozygpu $(IMAGE_TAR) $(IMAGE_BUILD)/work
