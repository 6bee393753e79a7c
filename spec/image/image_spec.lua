-- The OCI image archive `make image` writes (build/cozygpu-image.tar; or
-- $COZYGPU_IMAGE): it unpacks with nothing but tar, its config runs the
-- binary as a non-root user with the version's labels, its root filesystem
-- holds no shell and no package manager, and the binary in it, run on the
-- image's own loader and libraries, answers as build/bin/cozygpu does.
--
-- Pending when the archive is missing: `make test` does not build it.
-- Run as root (CI), the image's binary runs under chroot as uid 65532; else
-- on the image's dynamic loader with --library-path into the image, and
-- with --library/--policies/--pci-ids pointing into it (the compiled-in
-- paths exist only inside the image). COZYGPU_IMAGE_RUN=loader forces the
-- second way.
local sysfs = require "sysfs"

local IMAGE = os.getenv("COZYGPU_IMAGE") or "build/cozygpu-image.tar"
local q = H.q

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

local function sh(cmd)
  local out = os.tmpname()
  local ok = os.execute(cmd .. " >" .. q(out) .. " 2>&1")
  local s = H.read(out)
  os.remove(out)
  return ok == true, s
end

local function line(cmd)
  local p = io.popen(cmd)
  local s = p:read("l")
  p:close()
  return s
end

if not exists(IMAGE) then
  describe("the image", function()
    it("is checked once built", function()
      pending(IMAGE .. " not found: run `make image` (it is not built by `make test`)")
    end)
  end)
  return
end

-- An image built at another commit than the tree's is not this tree's
-- image: its specs are pending rather than failing on old behaviour.
local function member(name)
  local p = io.popen("tar -xOf " .. q(IMAGE) .. " " .. q(name) .. " 2>/dev/null")
  local s = p:read("a")
  p:close()
  return s
end
local function blob_name(digest) return "blobs/sha256/" .. tostring(digest):match("^sha256:(%x+)$") end
local built_at
do
  local idx = H.json.decode(member("index.json"))
  local man = idx and H.json.decode(member(blob_name(idx.manifests[1].digest)))
  local cfg = man and H.json.decode(member(blob_name(man.config.digest)))
  built_at = cfg and cfg.config and cfg.config.Labels and cfg.config.Labels["org.opencontainers.image.revision"]
end
local head = line("git rev-parse --short HEAD 2>/dev/null") or "unknown"
if built_at ~= head then
  describe("the image", function()
    it("is checked when built from this commit", function()
      pending(("%s was built at revision %s, the tree is at %s: rerun `make image`"):format(IMAGE, tostring(built_at), head))
    end)
  end)
  return
end

describe("the image " .. IMAGE, function()
  local dir, layout, rootfs, config, manifest, index
  -- COZYGPU_IMAGE_RUN=loader picks the loader mode as root too
  local as_root = line("id -u") == "0" and os.getenv("COZYGPU_IMAGE_RUN") ~= "loader"
  local version = H.read("VERSION"):match("^(%S+)")

  local function blob(digest)
    local hex = assert(digest:match("^sha256:(%x+)$"), "not a sha256 digest: " .. tostring(digest))
    return layout .. "/blobs/sha256/" .. hex
  end

  setup(function()
    dir = H.tmpdir()
    layout, rootfs = dir .. "/layout", dir .. "/rootfs"
    assert(os.execute("mkdir -p " .. q(layout) .. " " .. q(rootfs)))
    local ok, out = sh("tar -xf " .. q(IMAGE) .. " -C " .. q(layout))
    assert(ok, "tar -xf " .. IMAGE .. ": " .. out)
    index = assert(H.json.decode(H.read(layout .. "/index.json")))
    manifest = assert(H.json.decode(H.read(blob(index.manifests[1].digest))))
    config = assert(H.json.decode(H.read(blob(manifest.config.digest))))
    for _, l in ipairs(manifest.layers) do
      assert.equal("application/vnd.oci.image.layer.v1.tar+gzip", l.mediaType)
      ok, out = sh("tar -xzf " .. q(blob(l.digest)) .. " -C " .. q(rootfs))
      assert(ok, "extracting layer " .. l.digest .. ": " .. out)
    end
  end)

  teardown(function()
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  -- `at(name)`: how the image's binary names the file `name` of the image
  -- (absolute under chroot, a host path into the unpacked root otherwise).
  local function at(name)
    return as_root and name or rootfs .. "/" .. name
  end
  -- The image's binary with `args` (a list): stdout, stderr, exit code.
  local function run_image(args)
    local parts = {}
    for i, a in ipairs(args) do parts[i] = q(a) end
    local cmd
    if as_root then
      -- the image's environment only (chroot itself is found first)
      local chroot = assert(line("command -v chroot"), "chroot not found")
      cmd = ("cd %s && env -i PATH=/usr/bin %s --userspec=65532:65532 . /usr/bin/cozygpu %s")
          :format(q(rootfs), q(chroot), table.concat(parts, " "))
    else
      local interp = line("readelf -l " .. q(rootfs .. "/usr/bin/cozygpu")
        .. " | sed -n 's/.*Requesting program interpreter: \\(.*\\)\\]$/\\1/p'")
      local libdir = line("ls -d " .. q(rootfs) .. "/usr/lib/*-linux-gnu | head -1")
      cmd = ("cd %s && env -i %s --library-path %s %s %s"):format(q(rootfs), q(rootfs .. interp), q(libdir),
        q(rootfs .. "/usr/bin/cozygpu"), table.concat(parts, " "))
    end
    local out, err = os.tmpname(), os.tmpname()
    local _, _, code = os.execute(cmd .. " >" .. q(out) .. " 2>" .. q(err))
    local o, e = H.read(out), H.read(err)
    os.remove(out) os.remove(err)
    return o, e, code
  end
  -- the default bundle and library inside the image, named for the loader
  -- mode only (under chroot the compiled-in defaults are what is tested)
  local function defaults()
    if as_root then return {} end
    return { "--library", at("usr/share/cozygpu/lua"), "--policies", at("usr/share/cozygpu/policies") }
  end
  local function copy_in(host, name)
    local ok, out = sh(("mkdir -p %s && cp -a %s/. %s/"):format(q(rootfs .. "/" .. name), q(host), q(rootfs .. "/" .. name)))
    assert(ok, out)
  end
  local function abs(p)
    if p:sub(1, 1) == "/" then return p end
    return line("pwd") .. "/" .. p
  end

  it("runs /usr/bin/cozygpu as the non-root user 65532, with /usr/bin on PATH", function()
    local c = config.config
    assert.equal("65532:65532", c.User)
    assert.same({ "/usr/bin/cozygpu" }, c.Entrypoint)
    local path
    for _, e in ipairs(c.Env or {}) do path = e:match("^PATH=(.*)$") or path end
    assert.truthy(path and (":" .. path .. ":"):find(":/usr/bin:", 1, true), "PATH: " .. tostring(path))
    assert.equal("linux", config.os)
  end)

  it("carries the OCI labels of this version and revision", function()
    local l = config.config.Labels
    assert.equal("cozygpu", l["org.opencontainers.image.title"])
    assert.equal(version, l["org.opencontainers.image.version"])
    assert.truthy(l["org.opencontainers.image.source"])
    assert.truthy(l["org.opencontainers.image.created"])
    assert.truthy(l["org.opencontainers.image.revision"])
    assert.equal(head, l["org.opencontainers.image.revision"])
    -- and the binary in it says the same
    local out = run_image { "--version" }
    assert.equal(("cozygpu %s (revision %s)\n"):format(version, head), out)
    -- the name podman, skopeo (ref.name) and docker (io.containerd.image.name) give it
    local a = index.manifests[1].annotations
    assert.equal("ghcr.io/cozystack/cozygpu:" .. version, a["org.opencontainers.image.ref.name"])
    assert.equal("ghcr.io/cozystack/cozygpu:" .. version, a["io.containerd.image.name"])
  end)

  it("has no shell and no package manager", function()
    for _, p in ipairs { "bin/sh", "bin/bash", "bin/dash", "usr/bin/sh", "usr/bin/bash", "usr/bin/dash", "usr/bin/dpkg",
      "usr/bin/apt", "usr/bin/apt-get", "usr/bin/perl", "usr/bin/env", "usr/bin/busybox", "sbin/ldconfig" } do
      assert.is_false(exists(rootfs .. "/" .. p), p .. " is in the image")
    end
    -- every program in the image: the binary alone
    local ok, out = sh("cd " .. q(rootfs) .. " && find . -type f -perm /111 ! -name '*.so*' | sort")
    assert(ok, out)
    assert.equal("./usr/bin/cozygpu\n", out)
  end)

  it("holds the CA bundle, pci.ids, the library, the policies and a sticky /tmp", function()
    for _, p in ipairs { "etc/ssl/certs/ca-certificates.crt", "usr/share/misc/pci.ids", "etc/passwd",
      "usr/share/cozygpu/lua/cozygpu", "usr/share/cozygpu/policies" } do
      assert.is_true(exists(rootfs .. "/" .. p) or os.execute("test -d " .. q(rootfs .. "/" .. p)) == true, p)
    end
    assert.equal("drwxrwxrwt", line("stat -c %A " .. q(rootfs .. "/tmp")))
    assert.truthy(H.read(rootfs .. "/etc/passwd"):find("\nnonroot:x:65532:65532:", 1, true))
  end)

  it("prints the VERSION and the revision (`cozygpu --version`), as build/bin/cozygpu does", function()
    local out, err, code = run_image { "--version" }
    assert.equal(0, code, err)
    assert.matches("^cozygpu " .. H.pat(version) .. " %(revision %S+%)\n$", out)
    assert.equal(out, (H.run { "--version" }))
  end)

  it("answers examples/reviews exactly as build/bin/cozygpu does", function()
    copy_in("examples", "examples")
    for _, output in ipairs { "json", "table" } do
      local base = { "review", "--cluster", "examples/classes", "--cluster", "examples/cluster",
        "--config", "examples/config.yaml", "--output", output }
      local args, host = {}, {}
      for _, a in ipairs(base) do args[#args + 1], host[#host + 1] = a, a end
      for _, a in ipairs(defaults()) do args[#args + 1] = a end
      args[#args + 1], host[#host + 1] = "examples/reviews", "examples/reviews"
      local out, err, code = run_image(args)
      assert.equal(0, code, err)
      -- the same relative paths, from the repository, on the binary's own defaults
      local want, werr, wcode = H.run(host)
      assert.equal(0, wcode, werr)
      assert.is_true(#out > 0)
      assert.equal(want, out)
      assert.equal(werr, err)
    end
  end)

  it("runs on a read-only root: the controller needs only a writable /tmp (its --state-dir)", function()
    if not as_root then return pending("needs root (chroot, mount namespaces)") end
    if os.execute("unshare -m true 2>/dev/null") ~= true then
      return pending("unshare -m is not permitted here (no CAP_SYS_ADMIN)")
    end
    local chroot = line("command -v chroot")
    -- the root bound read-only onto itself in a private mount namespace
    local function ro(tmpfs, args)
      local script = ("mount --bind %s %s && mount -o remount,ro,bind %s && %s env -i PATH=/usr/bin %s --userspec=65532:65532 %s /usr/bin/cozygpu %s")
          :format(q(rootfs), q(rootfs), q(rootfs), tmpfs and ("mount -t tmpfs -o size=16m tmpfs " .. q(rootfs .. "/tmp") .. " &&") or "",
            q(chroot), q(rootfs), args)
      return sh("unshare -m sh -c " .. q(script))
    end
    local flags = "controller --tls-cert-file=/none.crt --tls-key-file=/none.key"
    local ok, out = ro(false, flags)
    assert.is_false(ok)
    assert.matches("%-%-state%-dir /tmp: not a writable directory: Read%-only file system", out)
    -- with /tmp writable it gets past its flags to looking for the API server
    ok, out = ro(true, flags)
    assert.is_false(ok)
    assert.matches("no configuration: no kubeconfig given", out)
    ok, out = ro(false, "version")
    assert.is_true(ok, out)
  end)

  it("lists a fake sysfs's GPUs (`cozygpu inventory`) with the image's own pci.ids, as build/bin/cozygpu does", function()
    local tree = sysfs.build { functions = {
      { address = "0000:41:00.0", device = "26b9", subsystem = "10de:1851", driver = "nvidia", iommu = 45, numa = 0 },
      { address = "0000:c1:00.0", device = "1eb8", iommu = 90 },
    } }
    local ok, err0 = pcall(function()
      copy_in(tree.root, "fakesys")
      local args = { "inventory", "--sysfs", at("fakesys"), "--output", "json" }
      if not as_root then
        args[#args + 1] = "--pci-ids"
        args[#args + 1] = at("usr/share/misc/pci.ids")
      end
      local out, err, code = run_image(args)
      assert.equal(0, code, err)
      local want, werr, wcode = H.run { "inventory", "--sysfs", abs(tree.root), "--output", "json",
        "--pci-ids", rootfs .. "/usr/share/misc/pci.ids" }
      assert.equal(0, wcode, werr)
      assert.equal(want, out)
      local inv = assert(H.json.decode(out))
      assert.equal(2, #inv.functions)
      -- the names come from the image's pci.ids
      assert.truthy(out:find('"model": "Tesla T4"', 1, true), out)
    end)
    tree:remove()
    assert(ok, err0)
  end)
end)
