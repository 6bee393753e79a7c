-- deploy/monitoring/: the Grafana dashboard, the PrometheusRule and its
-- promtool unit tests, and docs/runbook.md (decision 0031).
-- Every metric the dashboard and the alerts name must be one core/ exports
-- (a histogram's _bucket, _sum and _count only for histograms); each alert
-- has a severity, a runbook section, and a promtool test that makes it fire
-- and one where it stays quiet. promtool (Debian's `prometheus` package,
-- installed by `make deps`) checks and tests the rule groups, extracted from
-- the PrometheusRule's spec.groups through the C YAML loader, and parses
-- every dashboard query (as recording rules, $__rate_interval and $job
-- given values).
local core, json = H.core, H.json

local DASHBOARD = "deploy/monitoring/cozygpu-dashboard.json"
local RULES = "deploy/monitoring/cozygpu-rules.yaml"
local RULE_TESTS = "deploy/monitoring/cozygpu-rules.test.yaml"
local RUNBOOK = "docs/runbook.md"
-- the rule_files name cozygpu-rules.test.yaml gives the extracted groups
local GROUPS_FILE = "cozygpu-rules.groups.yaml"

local function lines_of(cmd)
  local p = io.popen(cmd)
  local t = {}
  for l in p:lines() do t[#t + 1] = l end
  p:close()
  return t
end

-- The metric families core/ exports: name -> "histogram" | "other". A name
-- is the string literal (or the #define'd literal, in a source or in a
-- header such as server/webhook_internal.h) a metrics_declare,
-- metrics_declare_histogram, metrics_counter_add, metrics_gauge_set or
-- metrics_histogram_observe call names first.
local function exported_metrics()
  local defines, families = {}, {}
  local files = lines_of("find core -name '*.c' | sort")
  assert(#files > 0, "no core/ sources (run from the repository root)")
  for _, f in ipairs(lines_of("find core -name '*.c' -o -name '*.h' | sort")) do
    for macro, lit in H.read(f):gmatch("#define%s+([%w_]+)%s+\"(cozygpu_[%w_]+)\"") do defines[macro] = lit end
  end
  for _, f in ipairs(files) do
    local text = H.read(f)
    for fn, first, rest in text:gmatch("metrics_([%w_]+)%s*%(%s*([^,%)]+),([^;]*)") do
      if fn == "declare" or fn == "declare_histogram" or fn == "counter_add" or fn == "gauge_set"
        or fn == "histogram_observe" then
        local name = first:match('^"(cozygpu_[%w_]+)"$') or defines[first:match("^([%w_]+)$") or ""]
        if name then
          local hist = fn == "declare_histogram" or fn == "histogram_observe"
            or (fn == "declare" and rest:match('^%s*"histogram"'))
          if hist then families[name] = "histogram"
          elseif not families[name] then families[name] = "other" end
        end
      end
    end
  end
  return families
end

-- Each cozygpu_* name in a PromQL expression.
local function names_in(expr, into)
  for n in expr:gmatch("cozygpu_[%w_]+") do into[n] = true end
end

-- A series name the families export: the family itself, or a histogram's
-- _bucket, _sum or _count. Returns nil and why not.
local function check_name(families, n)
  if families[n] then return true end
  local base, suffix = n:match("^(.-)_(%a+)$")
  if base and (suffix == "bucket" or suffix == "sum" or suffix == "count") then
    if families[base] == "histogram" then return true end
    if families[base] then return nil, n .. ": " .. base .. " is not a histogram" end
  end
  return nil, n .. ": no metric of that name in core/"
end

-- GitHub's anchor for a Markdown heading: lower case, spaces to '-',
-- punctuation but '-' and '_' dropped.
local function anchor(heading)
  return (heading:lower():gsub("[^%w%s%-_]", ""):gsub("%s", "-"))
end

local function runbook_sections()
  local s = {}
  for h in H.read(RUNBOOK):gmatch("\n## ([^\n]+)") do s[anchor(h)] = h end
  return s
end

local function dashboard()
  return assert(json.decode(H.read(DASHBOARD)))
end

local function each_panel(d, fn)
  for _, p in ipairs(d.panels) do
    fn(p)
    for _, q in ipairs(p.panels or {}) do fn(q) end
  end
end

-- The objects of a YAML file, through the C loader (kubectl's YAML rules).
local function yaml_objects(path)
  local docs, err = core.manifests(path)
  assert(docs, err)
  local out = {}
  for i, d in ipairs(docs) do out[i] = d.object end
  return out
end

local function rule_doc()
  local docs = yaml_objects(RULES)
  assert.are.equal(1, #docs)
  return docs[1]
end

local function alerts()
  local out = {}
  for _, g in ipairs(rule_doc().spec.groups) do
    for _, r in ipairs(g.rules) do
      if r.alert then out[#out + 1] = r end
    end
  end
  return out
end

describe("the monitoring dashboard", function()
  it("is a Grafana dashboard with a Prometheus data source variable", function()
    local d = dashboard()
    assert.is_true(d.schemaVersion >= 39, "schemaVersion " .. tostring(d.schemaVersion))
    assert.is_string(d.uid)
    assert.is_string(d.title)
    local ds
    for _, v in ipairs(d.templating.list) do
      if v.name == "datasource" then ds = v end
    end
    assert.is_table(ds, "no templating variable named datasource")
    assert.are.equal("datasource", ds.type)
    assert.are.equal("prometheus", ds.query)
  end)

  it("queries the ${datasource} variable in every panel and target, with unique ids", function()
    local ids, n = {}, 0
    each_panel(dashboard(), function(p)
      assert.is_nil(ids[p.id], "panel id " .. tostring(p.id) .. " twice")
      ids[p.id] = true
      if p.type ~= "row" then
        assert.are.equal("${datasource}", p.datasource.uid, p.title)
        assert.is_true(#p.targets > 0, p.title)
        for _, t in ipairs(p.targets) do
          assert.are.equal("${datasource}", t.datasource.uid, p.title)
          assert.is_string(t.expr, p.title)
          n = n + 1
        end
      end
    end)
    assert.is_true(n > 10)
  end)

  it("names only metrics core/ exports", function()
    local families, used = exported_metrics(), {}
    assert.are.equal("histogram", families.cozygpu_admission_review_duration_seconds) -- the scan itself works
    assert.are.equal("histogram", families.cozygpu_binder_bind_latency_seconds)
    assert.are.equal("other", families.cozygpu_admission_reviews_total)
    each_panel(dashboard(), function(p)
      for _, t in ipairs(p.targets or {}) do names_in(t.expr, used) end
    end)
    for _, v in ipairs(dashboard().templating.list) do
      if v.definition then names_in(v.definition, used) end
    end
    local bad = {}
    for n in pairs(used) do
      local ok, why = check_name(families, n)
      if not ok then bad[#bad + 1] = why end
    end
    table.sort(bad)
    assert.are.same({}, bad)
  end)

  it("has a panel for each thing an operator watches (issue 14 item 3)", function()
    local used = {}
    each_panel(dashboard(), function(p)
      for _, t in ipairs(p.targets or {}) do names_in(t.expr, used) end
    end)
    for _, n in ipairs {
      "cozygpu_admission_reviews_total", "cozygpu_admission_review_duration_seconds_bucket",
      "cozygpu_policy_errors_total", "cozygpu_policy_rule_errors_total", "cozygpu_policy_reloads_total",
      "cozygpu_policy_bundle_generation", "cozygpu_leader", "cozygpu_class_capacity_devices",
      "cozygpu_class_free_devices", "cozygpu_class_claimed_devices", "cozygpu_binder_placements_total",
      "cozygpu_binder_moves_total", "cozygpu_binder_rebinds_total", "cozygpu_binder_refusals_total",
      "cozygpu_binder_bind_latency_seconds_bucket", "cozygpu_usage_record_writes_total",
      "cozygpu_license_copy_writes_total", "cozygpu_usage_records_available", "cozygpu_policy_reload_failing",
    } do
      assert.is_true(used[n] == true, n .. " is on no panel")
    end
  end)
end)

describe("the alerting rules", function()
  it("are one PrometheusRule whose alerts each have a severity and a runbook section", function()
    local doc = rule_doc()
    assert.are.equal("monitoring.coreos.com/v1", doc.apiVersion)
    assert.are.equal("PrometheusRule", doc.kind)
    assert.are.equal("cozy-gpu", doc.metadata.namespace)
    local sections, seen = runbook_sections(), {}
    local list = alerts()
    assert.is_true(#list >= 7)
    for _, r in ipairs(list) do
      assert.is_nil(seen[r.alert], r.alert .. " twice")
      seen[r.alert] = true
      assert.is_truthy(({ critical = 1, warning = 1, info = 1 })[r.labels and r.labels.severity], r.alert)
      assert.is_string(r.annotations.summary, r.alert)
      local a = r.annotations.runbook_url:match("^docs/runbook%.md#(.+)$")
      assert.is_string(a, r.alert .. ": runbook_url " .. tostring(r.annotations.runbook_url))
      assert.are.equal(r.alert, sections[a], r.alert .. ": no section #" .. a .. " in " .. RUNBOOK)
    end
    for a, h in pairs(sections) do
      assert.is_true(seen[h] == true, RUNBOOK .. ": section " .. h .. " has no alert")
    end
  end)

  it("name only metrics core/ exports", function()
    local families, used, bad = exported_metrics(), {}, {}
    for _, g in ipairs(rule_doc().spec.groups) do
      for _, r in ipairs(g.rules) do names_in(r.expr, used) end
    end
    for n in pairs(used) do
      local ok, why = check_name(families, n)
      if not ok then bad[#bad + 1] = why end
    end
    table.sort(bad)
    assert.are.same({}, bad)
  end)

  it("warn of webhook latency at 70 % of the webhooks' timeoutSeconds", function()
    local timeout
    for _, d in ipairs(yaml_objects("deploy/50-webhooks.yaml")) do
      for _, w in ipairs(d.webhooks or {}) do
        timeout = timeout or w.timeoutSeconds
        assert.are.equal(timeout, w.timeoutSeconds, w.name .. ": every webhook has the same timeout")
      end
    end
    assert.is_number(timeout)
    local hit
    for _, r in ipairs(alerts()) do
      if r.alert == "CozyGPUWebhookLatencyNearTimeout" then
        assert.matches("histogram_quantile%(0%.99,", r.expr)
        hit = tonumber(r.expr:match(">%s*([%d%.]+)%s*$"))
      end
    end
    assert.are.equal(timeout * 0.7, hit)
  end)

  it("only count usage records on the leader (followers export 0)", function()
    for _, r in ipairs(alerts()) do
      if r.expr:match("cozygpu_usage_records_available") then
        assert.matches("and on (instance) (cozygpu_leader == 1)", r.expr, 1, true)
      end
    end
  end)

  it("each have a promtool test that fires them and one that does not", function()
    local tests = yaml_objects(RULE_TESTS)[1]
    assert.are.same({ GROUPS_FILE }, tests.rule_files)
    local fires, quiet = {}, {}
    for _, t in ipairs(tests.tests) do
      for _, c in ipairs(t.alert_rule_test or {}) do
        if #(c.exp_alerts or {}) > 0 then fires[c.alertname] = true else quiet[c.alertname] = true end
      end
    end
    for _, r in ipairs(alerts()) do
      assert.is_true(fires[r.alert] == true, r.alert .. ": no test where it fires")
      assert.is_true(quiet[r.alert] == true, r.alert .. ": no test where it stays quiet")
    end
  end)

  describe("under promtool", function()
    if not os.execute("command -v promtool >/dev/null 2>&1") then
      pending("promtool not installed (Debian package prometheus; `make deps` installs it)")
      return
    end
    local dir
    before_each(function()
      dir = H.tmpdir()
      -- promtool reads a plain rule-group file; JSON is YAML
      H.write(dir .. "/" .. GROUPS_FILE, json.encode({ groups = rule_doc().spec.groups }))
      H.write(dir .. "/cozygpu-rules.test.yaml", H.read(RULE_TESTS))
    end)
    after_each(function()
      if dir then os.execute("rm -rf " .. H.q(dir)) end
      dir = nil
    end)

    local function promtool(args)
      local p = io.popen("cd " .. H.q(dir) .. " && promtool " .. args .. " 2>&1; echo \"rc=$?\"")
      local out = p:read("a")
      p:close()
      return out:gsub("rc=%d+\n$", ""), tonumber(out:match("rc=(%d+)\n$"))
    end

    it("check rules: the groups are valid", function()
      local out, rc = promtool("check rules " .. GROUPS_FILE)
      assert.are.equal(0, rc, out)
      assert.matches("SUCCESS: " .. #alerts() .. " rules found", out)
    end)

    it("test rules: every unit test passes", function()
      local out, rc = promtool("test rules cozygpu-rules.test.yaml")
      assert.are.equal(0, rc, out)
      assert.matches("SUCCESS", out)
    end)

    it("check rules: every dashboard query parses as PromQL", function()
      -- each target as a recording rule, Grafana's variables given values
      local rules = {}
      each_panel(dashboard(), function(p)
        for _, t in ipairs(p.targets or {}) do
          local expr = t.expr:gsub("%$__rate_interval", "5m"):gsub("%$job", ".*")
          assert.is_nil(expr:find("%$"), p.title .. ": a variable left in " .. expr)
          rules[#rules + 1] = { record = ("cozygpu:dashboard:%d_%s"):format(p.id, t.refId), expr = expr }
        end
      end)
      H.write(dir .. "/dashboard.rules.yaml", json.encode({ groups = { { name = "dashboard", rules = rules } } }))
      local out, rc = promtool("check rules dashboard.rules.yaml")
      assert.are.equal(0, rc, out)
      assert.matches("SUCCESS: " .. #rules .. " rules found", out)
    end)

    it("test rules fails when an alert's threshold is broken (the tests can fail)", function()
      local doc = rule_doc()
      for _, g in ipairs(doc.spec.groups) do
        for _, r in ipairs(g.rules) do
          if r.alert == "CozyGPUClaimsLost" then r.expr = r.expr:gsub("> 0$", "> 5") end
        end
      end
      H.write(dir .. "/" .. GROUPS_FILE, json.encode({ groups = doc.spec.groups }))
      local out, rc = promtool("test rules cozygpu-rules.test.yaml")
      assert.are_not.equal(0, rc, out)
      assert.matches("CozyGPUClaimsLost", out)
    end)
  end)
end)
