// Validates every object in deploy/kubernetes/ against Kubernetes' and KEDA's own schemas
// (ctest deploy_manifests_schema, label deploy).
//
//   node tests/deploy/schema/validate.mjs MANIFESTS_DIR WORK_DIR
//
// 1. Schema: each YAML document is looked up by apiVersion and kind in the npm packages
//    kubernetes-models (Kubernetes' OpenAPI schemas) and @kubernetes-models/keda (KEDA's
//    CRDs), pinned in package.json and package-lock.json, and validated with the model's
//    validate() (required fields, types, enums, formats). A kind neither package knows
//    fails: nothing is waved through unchecked.
// 2. Unknown fields: those schemas, like the API server's OpenAPI, allow fields they do not
//    name, which the API server then drops (`kubectl apply` warns, or with
//    --validate=strict refuses). Each document is therefore also written, as an object
//    literal of the model's TypeScript type, to WORK_DIR/manifests.ts and compiled with
//    `tsc --noEmit --strict`: a misspelt field at any depth is an excess-property error.
// 3. ConfigMap data that names a .yaml key must parse as YAML (prometheus-adapter's rules).
//
// Before trusting a pass, the script shows each check refusing a broken copy of the first
// Deployment (spec.replicas as a string; a misspelt field in a probe). Exits 0 when every
// document passes and both controls are refused; 1 otherwise, naming file, document and
// field.
import { createRequire } from "node:module";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const [manifestsDir, workDir] = process.argv.slice(2);
if (!manifestsDir || !workDir) {
  console.error("usage: validate.mjs MANIFESTS_DIR WORK_DIR");
  process.exit(2);
}
if (!fs.existsSync(path.join(here, "node_modules", "kubernetes-models"))) {
  console.error(`FAIL: ${here}/node_modules is missing, so nothing was validated. Install the pinned ` +
                "packages with `scripts/deps.sh --test` (npm ci in this folder) and run the test again.");
  process.exit(1);
}
const YAML = require("yaml");

let failures = 0;
const fail = (msg) => {
  console.log("FAIL: " + msg);
  failures++;
};

// The model class of apiVersion/kind: its module and its TypeScript interface name.
function modelOf(apiVersion, kind) {
  const candidates = [`kubernetes-models/${apiVersion}/${kind}`];
  if (apiVersion.startsWith("keda.sh/")) candidates.unshift(`@kubernetes-models/keda/${apiVersion}/${kind}`);
  for (const module of candidates) {
    try {
      const cls = require(module)[kind];
      if (typeof cls === "function") return { module, cls, iface: `I${kind}` };
    } catch (e) {
      if (e.code !== "MODULE_NOT_FOUND" && e.code !== "ERR_PACKAGE_PATH_NOT_EXPORTED") throw e;
    }
  }
  return null;
}

function schemaErrors(model, doc) {
  try {
    new model.cls(doc).validate();
    return null;
  } catch (e) {
    return e.message;
  }
}

const files = fs.readdirSync(manifestsDir).filter((f) => f.endsWith(".yaml")).sort();
if (files.length === 0) {
  fail(`no manifests under ${manifestsDir}`);
  process.exit(1);
}
const objects = [];  // {where, doc, model}
for (const file of files) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(path.join(manifestsDir, file), "utf8"));
  docs.forEach((d, i) => {
    const where = `${file}, document ${i + 1}`;
    if (d.errors.length) return fail(`${where}: not YAML: ${d.errors[0].message}`);
    const doc = d.toJS();
    if (doc === null || doc === undefined) return;  // an empty document (a trailing ---)
    if (!doc.apiVersion || !doc.kind) return fail(`${where}: no apiVersion or kind`);
    const model = modelOf(doc.apiVersion, doc.kind);
    if (!model) return fail(`${where}: no schema for ${doc.apiVersion} ${doc.kind} in kubernetes-models or @kubernetes-models/keda`);
    objects.push({ where: `${where} (${doc.apiVersion} ${doc.kind} ${doc.metadata?.name ?? "?"})`, doc, model });
  });
}

// 1. The schemas.
for (const o of objects) {
  const errors = schemaErrors(o.model, o.doc);
  if (errors) fail(`${o.where}: ${errors}`);
  else console.log(`schema ok: ${o.where}`);
}

// 3. Embedded YAML.
for (const o of objects) {
  if (o.doc.kind !== "ConfigMap") continue;
  for (const [key, value] of Object.entries(o.doc.data ?? {})) {
    if (!/\.ya?ml$/.test(key)) continue;
    const parsed = YAML.parseDocument(value);
    if (parsed.errors.length) fail(`${o.where}: data.${key} is not YAML: ${parsed.errors[0].message}`);
    else console.log(`yaml ok: ${o.where} data.${key}`);
  }
}

// The controls: broken copies the checks must refuse.
const deployment = objects.find((o) => o.doc.kind === "Deployment");
if (!deployment) fail("no Deployment to build the negative controls from");
const typo = deployment && structuredClone(deployment.doc);
if (deployment) {
  const wrongType = structuredClone(deployment.doc);
  wrongType.spec.replicas = "four";
  if (!schemaErrors(deployment.model, wrongType)) fail("control: the schema accepted spec.replicas: \"four\"");
  else console.log("control ok: the schema refuses spec.replicas: \"four\"");
  const probe = typo.spec.template.spec.containers[0].readinessProbe;
  probe.httpGet.pathh = probe.httpGet.path;
}

// 2. Unknown fields, by the TypeScript compiler. One literal per document, each on lines of
// its own, so that an error's line names the document and the field.
fs.mkdirSync(workDir, { recursive: true });
const lines = ["// Generated by tests/deploy/schema/validate.mjs: every manifest as its model's type."];
const imports = new Map();
const entries = objects.map((o) => ({ where: o.where, doc: o.doc, model: o.model }));
if (deployment) entries.push({ where: "control (a misspelt readinessProbe.httpGet.pathh)", doc: typo, model: deployment.model, control: true });
entries.forEach((e, i) => {
  const alias = `T${i}`;
  imports.set(alias, e.model);
  e.body = JSON.stringify(e.doc, null, 2).split("\n");
  e.body[0] = `export const doc${i}: ${alias} = ${e.body[0]}`;
  e.body[e.body.length - 1] += ";";
});
const header = [...imports].map(([alias, m]) => `import type { ${m.iface} as ${alias} } from "${m.module}";`);
const out = [...lines, ...header];
for (const e of entries) {
  e.first = out.length + 1;
  out.push(`// ${e.where}`, ...e.body);
  e.last = out.length;
}
const tsFile = path.join(workDir, "manifests.ts");
fs.writeFileSync(tsFile, out.join("\n") + "\n");
const tsconfig = {
  compilerOptions: {
    strict: true, noEmit: true, skipLibCheck: true, types: [], lib: ["es2022"],
    module: "commonjs", moduleResolution: "node", baseUrl: here,
    paths: { "*": [path.join(here, "node_modules", "*")] },
  },
  files: [tsFile],
};
fs.writeFileSync(path.join(workDir, "tsconfig.json"), JSON.stringify(tsconfig, null, 2));
let tscOutput = "";
try {
  execFileSync(process.execPath, [require.resolve("typescript/bin/tsc"), "-p", path.join(workDir, "tsconfig.json")],
               { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
} catch (e) {
  tscOutput = (e.stdout || "") + (e.stderr || "");
}
const diagnostics = tscOutput.split("\n").filter((l) => /error TS\d+/.test(l));
let controlRefused = false;
for (const d of diagnostics) {
  const m = /\((\d+),\d+\)/.exec(d);
  const line = m ? Number(m[1]) : 0;
  const e = entries.find((x) => line >= x.first && line <= x.last);
  if (e && e.control) {
    controlRefused = true;
    continue;
  }
  fail(`${e ? e.where : tsFile}: ${d.replace(/^.*error /, "error ")}${line ? ` (line ${line}: ${out[line - 1].trim()})` : ""}`);
}
if (deployment) {
  if (controlRefused) console.log("control ok: the compiler refuses a misspelt field (readinessProbe.httpGet.pathh)");
  else fail("control: the compiler accepted a misspelt readinessProbe.httpGet.pathh" + (tscOutput ? `:\n${tscOutput}` : ""));
}
if (diagnostics.length === (controlRefused ? 1 : 0)) console.log(`fields ok: ${objects.length} objects name only fields their schemas know`);

console.log(`${objects.length} objects in ${files.length} files; ${failures} failure(s)`);
process.exit(failures === 0 ? 0 : 1);
