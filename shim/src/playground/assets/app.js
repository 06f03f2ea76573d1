// gyre playground: pick a model, send a prompt, watch the tokens stream over
// gRPC-Web from the gRPC port, stop a generation, and watch the engine.
import { Client, FINISH_REASONS } from "/playground/grpcweb.js";

const $ = (id) => document.getElementById(id);
const STATS_INTERVAL_MS = 1000;

const ui = {
  endpoint: $("endpoint"),
  form: $("form"),
  model: $("model"),
  maxTokens: $("max-tokens"),
  temperature: $("temperature"),
  ignoreEos: $("ignore-eos"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
  status: $("status"),
  output: $("output"),
  ttft: $("ttft"),
  tps: $("tps"),
  tokens: $("tokens"),
  error: $("error"),
  grpcUrl: $("grpc-url"),
  apiKey: $("api-key"),
  reconnect: $("reconnect"),
  statsModel: $("stats-model"),
  statsStatus: $("stats-status"),
  kvBar: $("kv-bar"),
};

let client = null;
let models = [];
let running = null; // the AbortController of the generation in progress
let statsBusy = false;

function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = !message;
}

function setStatus(state, text) {
  ui.status.dataset.state = state;
  ui.status.textContent = text;
}

function errorText(e) {
  if (e instanceof TypeError) {
    // fetch's own failure: the port is unreachable or CORS refused the page.
    return `cannot reach ${ui.grpcUrl.value} (${e.message}); check the gRPC-Web URL under Connection`;
  }
  return e.message ?? String(e);
}

function selectedModel() {
  return models.find((m) => m.id === ui.model.value);
}

async function connect() {
  client = new Client(ui.grpcUrl.value, { apiKey: ui.apiKey.value.trim() });
  ui.endpoint.textContent = `gRPC-Web: ${ui.grpcUrl.value}`;
  ui.send.disabled = true;
  try {
    const listed = await client.listModels();
    models = listed.filter((m) => m.kind === "" || m.kind === "generate");
    const keep = ui.model.value;
    ui.model.replaceChildren(
      ...models.map((m) => new Option(m.aliases.length ? `${m.id} (${m.aliases.join(", ")})` : m.id, m.id)),
    );
    if (models.some((m) => m.id === keep)) ui.model.value = keep;
    if (!models.length) throw new Error("this server has no generative model");
    showError("");
    ui.send.disabled = running !== null;
    pollStats();
  } catch (e) {
    models = [];
    ui.model.replaceChildren();
    showError(`Listing the models failed: ${errorText(e)}`);
  }
}

function fmt(n) {
  return Number(n).toLocaleString("en-US");
}

async function pollStats() {
  const model = ui.model.value;
  if (!client || !model || statsBusy) return;
  statsBusy = true;
  try {
    const s = await client.getStats(model);
    ui.statsModel.textContent = s.model;
    $("stat-waiting").textContent = fmt(s.waiting);
    $("stat-running").textContent = fmt(s.running);
    $("stat-kv-used").textContent = fmt(s.kvBlocksUsed);
    $("stat-kv-total").textContent = fmt(s.kvBlocksTotal);
    $("stat-kv-cached").textContent = fmt(s.kvBlocksCached);
    const hitRate = s.prefixQueryTokensTotal ? ` (${((100 * s.prefixHitTokensTotal) / s.prefixQueryTokensTotal).toFixed(0)}%)` : "";
    $("stat-prefix-hits").textContent = `${fmt(s.prefixHitTokensTotal)} tokens${hitRate}`;
    $("stat-generated").textContent = fmt(s.generatedTokensTotal);
    $("stat-steps").textContent = fmt(s.stepsTotal);
    ui.kvBar.style.width = s.kvBlocksTotal ? `${(100 * s.kvBlocksUsed) / s.kvBlocksTotal}%` : "0";
    ui.statsStatus.textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    ui.statsStatus.textContent = `stats: ${errorText(e)}`;
  } finally {
    statsBusy = false;
  }
}

async function generate() {
  const model = selectedModel();
  const prompt = ui.prompt.value;
  if (!client || !model || !prompt.trim() || running) return;
  const maxTokens = ui.maxTokens.value === "" ? undefined : Number(ui.maxTokens.value);
  const temperature = ui.temperature.value === "" ? undefined : Number(ui.temperature.value);
  const request = {
    model: model.id,
    // Chat models get the prompt as one user message (rendered with their
    // chat template); others get it as raw text.
    ...(model.chat ? { messages: [{ role: "user", content: prompt }] } : { text: prompt }),
    maxTokens,
    temperature,
    ignoreEos: ui.ignoreEos.checked,
  };
  const controller = new AbortController();
  running = controller;
  ui.send.disabled = true;
  ui.stop.disabled = false;
  ui.output.textContent = "";
  ui.ttft.textContent = "–";
  ui.tps.textContent = "–";
  ui.tokens.textContent = "0";
  showError("");
  setStatus("running", "waiting for the first token…");

  const sent = performance.now();
  let first = null; // {at, tokens}: when the first delta came, and its tokens
  let tokens = 0;
  const rate = () => {
    const seconds = (performance.now() - first.at) / 1000;
    return tokens > first.tokens && seconds > 0 ? ((tokens - first.tokens) / seconds).toFixed(1) : "–";
  };
  try {
    for await (const event of client.generateStream(request, controller.signal)) {
      if (event.delta) {
        tokens += event.delta.tokenIds.length;
        if (first === null && (event.delta.text || event.delta.tokenIds.length)) {
          first = { at: performance.now(), tokens };
          ui.ttft.textContent = `${Math.round(first.at - sent)} ms`;
          setStatus("running", "generating…");
        }
        ui.output.textContent += event.delta.reasoning + event.delta.text;
        ui.tokens.textContent = fmt(tokens);
        if (first) ui.tps.textContent = rate();
      } else if (event.finish) {
        const f = event.finish;
        const reason = FINISH_REASONS[f.reason] ?? String(f.reason);
        if (f.usage) ui.tokens.textContent = fmt(f.usage.completionTokens);
        if (first) ui.tps.textContent = rate();
        if (f.error) {
          setStatus("error", `failed: ${f.error.message}`);
          showError(f.error.message);
        } else {
          const n = f.usage ? f.usage.completionTokens : tokens;
          setStatus("done", `finished (${reason}) after ${fmt(n)} tokens`);
        }
      }
    }
    if (ui.status.dataset.state === "running") setStatus("error", "the stream ended without a finish");
  } catch (e) {
    if (controller.signal.aborted) {
      if (first) ui.tps.textContent = rate();
      setStatus("stopped", `stopped after ${fmt(tokens)} tokens`);
    } else {
      setStatus("error", "failed");
      showError(errorText(e));
    }
  } finally {
    running = null;
    ui.stop.disabled = true;
    ui.send.disabled = !models.length;
    pollStats();
  }
}

async function start() {
  let config;
  try {
    const response = await fetch("/playground/config.json", { cache: "no-store" });
    config = await response.json();
  } catch (e) {
    showError(`Cannot read /playground/config.json: ${e.message}`);
    return;
  }
  // The gRPC port is reached on the host this page was loaded from.
  ui.grpcUrl.value = `${config.grpc.scheme}://${location.hostname}:${config.grpc.port}`;
  if (config.key_required) {
    ui.apiKey.placeholder = "required by this server";
    $("connection").open = true;
  }
  ui.form.addEventListener("submit", (e) => {
    e.preventDefault();
    generate();
  });
  ui.prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      generate();
    }
  });
  ui.stop.addEventListener("click", () => running?.abort());
  ui.reconnect.addEventListener("click", connect);
  ui.model.addEventListener("change", pollStats);
  await connect();
  setInterval(pollStats, STATS_INTERVAL_MS);
}

start();
