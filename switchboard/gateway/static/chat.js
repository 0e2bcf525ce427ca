// Switchboard web chat: OpenAI's Chat Completions API of this gateway, streamed (server-sent
// events over fetch), the conversation kept in localStorage. No dependencies; text is only
// ever set as textContent.
//
// Voice: the microphone button records with getUserMedia and an AudioWorklet
// (recorder-worklet.js), encodes 16 kHz mono 16-bit WAV here (MediaRecorder's container differs
// by browser, WebM or MP4; a WAV is the same everywhere and already at the recognizer's rate)
// and sends it as OpenAI's input_audio in the last user message; the
// answer's first chunk says what was heard (switchboard.asr), which becomes the user's bubble.
//
// Order tools (the header's switch): the chat offers the demo's tools (GET /demo/tools); the
// calls an answer makes are run against the gateway's fake order service (POST /demo/tools/NAME),
// their results go back as "tool" messages and the model answers from them, as an agent would.
"use strict";

const STORE = "switchboard.chat.v1";
const T = {
  en: { agent: "Agent (priority 1)", settings: "Settings", new: "New conversation", key: "API key",
        keyhint: "Kept in this browser only (localStorage).", send: "Send", stop: "Stop", stats: "stats",
        placeholder: "Ask about an order, a refund, delivery… (Enter sends, Shift+Enter: new line)",
        reused: "reused", of: "of", prompt: "prompt tokens", ttft: "time to first token", server: "server",
        tokens: "tokens", faq: "FAQ answer", p1: "priority 1", stopped: "(stopped)", lang: "中文",
        mic: "Speak", micstop: "■ Stop and send", listening: "…", heard: "heard", tools: "Order tools (demo)",
        called: "called", result: "result",
        micdenied: "Microphone access was denied. Allow the microphone for this site in the browser's settings, then try again.",
        nomic: "No microphone here: the browser allows recording only on secure (HTTPS) pages or on localhost.",
        nodevice: "No microphone was found.",
        micfailed: "The microphone could not be opened",
        tooshort: "That recording was too short: hold the button a little longer.",
        nospeech: "No speech was heard in that recording. Try again, a little closer to the microphone.",
        building: "Voice is not available yet: the speech model is still being built. Text chat works; try voice again in {s} s." },
  zh: { agent: "客服（优先级 1）", settings: "设置", new: "新对话", key: "API 密钥",
        keyhint: "只保存在本浏览器（localStorage）。", send: "发送", stop: "停止", stats: "统计",
        placeholder: "询问订单、退款、配送……（回车发送，Shift+回车换行）",
        reused: "复用", of: "/", prompt: "个提示词元", ttft: "首字时间", server: "服务端",
        tokens: "个词元", faq: "常见问题答案", p1: "优先级 1", stopped: "（已停止）", lang: "English",
        mic: "说话", micstop: "■ 停止并发送", listening: "…", heard: "识别", tools: "订单工具（演示）",
        called: "调用", result: "结果",
        micdenied: "麦克风权限被拒绝。请在浏览器设置中允许本站使用麦克风，然后重试。",
        nomic: "无法使用麦克风：浏览器只允许在安全（HTTPS）页面或 localhost 上录音。",
        nodevice: "未找到麦克风。",
        micfailed: "无法打开麦克风",
        tooshort: "录音太短，请多说一会儿。",
        nospeech: "录音中没有听到语音，请靠近麦克风再试一次。",
        building: "语音功能暂不可用：语音模型仍在构建中。文字聊天可以正常使用；请 {s} 秒后再试语音。" },
};

const $ = (id) => document.getElementById(id);
const SAMPLE_RATE = 16000;  // what the recognizer takes (the server resamples anything else)
const MAX_RECORD_MS = 60_000;  // then the recording stops and is sent
const MAX_TOOL_ROUNDS = 3;  // answers that call tools, per question, before the page stops asking
let demoTools = null;  // the demo's tool definitions, once fetched
let state = load();
let controller = null;
let recorder = null;  // while recording: { stream, context, source, node, chunks, timer }

function load() {
  try {
    const s = JSON.parse(localStorage.getItem(STORE) || "{}");
    return { messages: Array.isArray(s.messages) ? s.messages : [], key: s.key || "",
             priority: !!s.priority, tools: !!s.tools, lang: s.lang === "zh" ? "zh" : "en" };
  } catch (e) {
    return { messages: [], key: "", priority: false, tools: false, lang: "en" };
  }
}
function save() { localStorage.setItem(STORE, JSON.stringify(state)); }
function t(k) { return T[state.lang][k]; }

function applyLanguage() {
  document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
  document.querySelectorAll("[data-i18n]").forEach((el) => { el.textContent = t(el.dataset.i18n); });
  $("lang").textContent = t("lang");
  $("input").placeholder = t("placeholder");
  if (recorder) micButton(true);
  render();
}

function statsLine(m) {
  const s = m.stats || {};
  const parts = [];
  if (s.prompt_tokens !== undefined) parts.push(`${t("reused")} ${s.reused_tokens} ${t("of")} ${s.prompt_tokens} ${t("prompt")}`);
  if (m.ttft_ms !== undefined) {
    const server = s.ttft_ms != null ? ` (${t("server")} ${Math.round(s.ttft_ms)} ms)` : "";
    parts.push(`${t("ttft")} ${Math.round(m.ttft_ms)} ms${server}`);
  }
  if (s.generated_tokens !== undefined) parts.push(`${s.generated_tokens} ${t("tokens")}`);
  if (s.route) parts.push(`route ${s.route}`);
  if (s.asr) parts.push(`${t("heard")} ${Number(s.asr.audio_s).toFixed(1)} s / ${Math.round(s.asr.asr_ms)} ms`);
  if (s.fallback) parts.push(t("faq"));
  return parts.join(" · ");
}

function bubble(m, i) {
  const div = document.createElement("div");
  div.className = `msg ${m.role}` + (m.streaming ? " streaming" : "") + (m.voice ? " voice" : "");
  div.dataset.testid = `msg-${m.role}`;
  div.dataset.index = String(i);
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = m.role === "tool" ? `${t("result")}: ${m.content}` : m.content;
  div.appendChild(text);
  for (const call of m.tool_calls || []) {
    const line = document.createElement("div");
    line.className = "call";
    line.dataset.testid = "tool-call";
    line.textContent = `${t("called")} ${call.function.name}(${call.function.arguments})`;
    div.appendChild(line);
  }
  if (m.role === "assistant" && !m.streaming && (m.stats || m.ttft_ms !== undefined)) {
    const meta = document.createElement("div");
    meta.className = "meta";
    const btn = document.createElement("button");
    btn.type = "button";
    btn.textContent = t("stats");
    btn.dataset.testid = "stats-toggle";
    meta.appendChild(btn);
    if (m.priority === 1) {
      const p = document.createElement("span");
      p.className = "priority1";
      p.textContent = t("p1");
      meta.appendChild(p);
    }
    div.appendChild(meta);
    const stats = document.createElement("div");
    stats.className = "stats";
    stats.dataset.testid = "stats";
    stats.hidden = !m.showStats;
    stats.textContent = statsLine(m);
    div.appendChild(stats);
    btn.addEventListener("click", () => { m.showStats = !m.showStats; stats.hidden = !m.showStats; save(); });
  }
  return div;
}

function render() {
  const log = $("log");
  log.replaceChildren(...state.messages.map(bubble));
  log.scrollTop = log.scrollHeight;
}

function showError(text) {
  $("error").textContent = text || "";
  $("error").hidden = !text;
}

// The conversation as the API takes it: answers with their calls, the tools' results.
function apiMessages() {
  return state.messages.filter((m) => (m.content || m.tool_calls) && !m.pending).map((m) => {
    if (m.role === "tool") return { role: "tool", tool_call_id: m.tool_call_id, content: m.content };
    if (m.tool_calls) return { role: m.role, content: m.content || null, tool_calls: m.tool_calls };
    return { role: m.role, content: m.content };
  });
}

async function toolDefinitions(headers) {
  if (demoTools === null) {
    const r = await fetch("/demo/tools", { headers });
    if (!r.ok) throw await apiError(r);
    demoTools = (await r.json()).tools;
  }
  return demoTools;
}

// Each call of ``answer`` run by the demo's order service, its result a "tool" message.
async function runCalls(answer, headers) {
  for (const call of answer.tool_calls) {
    const r = await fetch(`/demo/tools/${encodeURIComponent(call.function.name)}`, {
      method: "POST", headers, body: call.function.arguments || "{}" });
    if (!r.ok) throw await apiError(r);
    state.messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify(await r.json()) });
  }
  render();
}

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("input").disabled = on;
  $("mic").disabled = on;
}

// An error answer as an Error with the API's message, code and Retry-After.
async function apiError(response) {
  const error = new Error(`HTTP ${response.status}`);
  try {
    const body = (await response.json()).error;
    error.message = body.message;
    error.code = body.code;
  } catch (e) { /* not JSON */ }
  error.retryAfter = response.headers.get("Retry-After");
  return error;
}

// What the page says of an error: its own words for the voice channel's, the server's otherwise.
function errorText(e) {
  if (e.code === "speech_model_not_ready") return t("building").replace("{s}", e.retryAfter || "30");
  if (e.code === "no_speech") return t("nospeech");
  return e.message;
}

function send(question) {
  return converse({ role: "user", content: question }, question);
}

function sendVoice(wav) {
  const asked = { role: "user", content: t("listening"), voice: true, pending: true };
  return converse(asked, [{ type: "input_audio", input_audio: { data: base64(wav), format: "wav" } }]);
}

// One turn: ``asked`` shown as the user's bubble, ``content`` sent as the last message's; with
// the order tools on, the answers that call tools and the answers to their results.
async function converse(asked, content) {
  showError("");
  const history = apiMessages();
  history.push({ role: "user", content });
  const priority = state.priority ? 1 : 2;
  state.messages.push(asked);
  const headers = { "Content-Type": "application/json", "X-Switchboard-Stats": "1",
                    "X-Switchboard-Priority": String(priority) };
  if (state.key) headers.Authorization = `Bearer ${state.key}`;
  controller = new AbortController();
  busy(true);
  try {
    const tools = state.tools ? await toolDefinitions(headers) : null;
    for (let round = 0; round < MAX_TOOL_ROUNDS; round++) {
      const answer = await answerOnce(round ? apiMessages() : history, asked, headers, priority, tools);
      if (!answer || !answer.tool_calls) break;
      await runCalls(answer, headers);
    }
  } catch (e) {
    if (e.name !== "AbortError") showError(errorText(e));
  } finally {
    controller = null;
    busy(false);
    save();
    render();
    $("input").focus();
  }
}

// One answer, streamed into a new bubble; null when nothing was answered (the question can be
// sent again). Errors other than the Stop button's are thrown after the bubble is settled.
async function answerOnce(messages, asked, headers, priority, tools) {
  const answer = { role: "assistant", content: "", streaming: true, priority };
  state.messages.push(answer);
  render();
  const t0 = performance.now();
  const body = { model: window.SWITCHBOARD_MODEL || "switchboard", messages, stream: true,
                 stream_options: { include_usage: true } };
  if (tools) body.tools = tools;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers, signal: controller.signal, body: JSON.stringify(body) });
    if (!response.ok) throw await apiError(response);
    await readEvents(response, (chunk) => {
      if (chunk.error) throw Object.assign(new Error(chunk.error.message), { code: chunk.error.code });
      const asr = chunk.switchboard && chunk.switchboard.asr;
      if (asr && asked.pending) {  // what was heard: the user's bubble
        asked.content = asr.transcript;
        asked.pending = false;
        render();
      }
      for (const c of chunk.choices || []) {
        const text = c.delta && c.delta.content;
        if (answer.ttft_ms === undefined && (text || (c.delta && c.delta.tool_calls))) {
          answer.ttft_ms = performance.now() - t0;
        }
        for (const d of (c.delta && c.delta.tool_calls) || []) {  // OpenAI's deltas: the first names the call
          answer.tool_calls = answer.tool_calls || [];
          if (d.id) answer.tool_calls[d.index] = { id: d.id, type: "function", function: { name: d.function.name, arguments: "" } };
          answer.tool_calls[d.index].function.arguments += (d.function && d.function.arguments) || "";
          render();
        }
        if (text) {
          answer.content += text;
          const last = $("log").lastElementChild;
          if (last) last.querySelector(".text").textContent = answer.content;
        }
      }
      if (chunk.usage) answer.stats = { ...(chunk.switchboard || {}), prompt_tokens: chunk.usage.prompt_tokens,
        reused_tokens: chunk.usage.prompt_tokens_details ? chunk.usage.prompt_tokens_details.cached_tokens : 0 };
    });
    return answer;
  } catch (e) {
    if (e.name === "AbortError" && !asked.pending) {
      answer.content += " " + t("stopped");
      answer.tool_calls = undefined;  // a call cut short is not run
      return null;
    }
    if (!answer.content && !answer.tool_calls) {  // nothing answered: the bubble goes...
      const i = state.messages.indexOf(answer);
      const first = state.messages[i - 1] === asked;  // ...and the question with it, to be sent again
      state.messages.splice(first ? i - 1 : i, first ? 2 : 1);
    }
    if (e.name === "AbortError") return null;
    throw e;
  } finally {
    answer.streaming = false;
  }
}

async function readEvents(response, onChunk) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder("utf-8");  // stream: true keeps a character split across reads whole
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onChunk(JSON.parse(data));
      }
    }
  }
}

async function discoverModel() {
  const headers = state.key ? { Authorization: `Bearer ${state.key}` } : {};
  try {
    const r = await fetch("/v1/models", { headers });
    if (r.status === 401) { $("settings").hidden = false; return; }
    const body = await r.json();
    if (body.data && body.data.length) window.SWITCHBOARD_MODEL = body.data[0].id;
  } catch (e) { /* the first chat says what is wrong */ }
}

// -- the microphone ---------------------------------------------------------------------------------
async function startRecording() {
  showError("");
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || !window.AudioWorkletNode) {
    showError(t("nomic"));
    return;
  }
  let stream;
  try {
    // The voice as the microphone hears it: the recognizer is trained on raw audio, and the
    // browser's gain control and noise suppression clip and smear it (nothing plays meanwhile,
    // so there is no echo to cancel).
    stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: false,
                                                                   noiseSuppression: false, autoGainControl: false } });
  } catch (e) {
    const denied = e.name === "NotAllowedError" || e.name === "SecurityError";
    showError(denied ? t("micdenied") : e.name === "NotFoundError" ? t("nodevice") : `${t("micfailed")}: ${e.message}`);
    return;
  }
  try {
    const context = new AudioContext();
    await context.audioWorklet.addModule("/static/recorder-worklet.js");
    const source = context.createMediaStreamSource(stream);
    const node = new AudioWorkletNode(context, "switchboard-recorder");
    const chunks = [];
    node.port.onmessage = (e) => { if (e.data instanceof Float32Array) chunks.push(e.data); };
    const mute = context.createGain();  // a node must reach the output to be processed; silently
    mute.gain.value = 0;
    source.connect(node).connect(mute).connect(context.destination);
    recorder = { stream, context, source, node, chunks, timer: setTimeout(stopRecording, MAX_RECORD_MS) };
    micButton(true);
  } catch (e) {
    stream.getTracks().forEach((track) => track.stop());
    showError(`${t("micfailed")}: ${e.message}`);
  }
}

async function stopRecording() {
  const r = recorder;
  if (!r) return;
  recorder = null;
  clearTimeout(r.timer);
  micButton(false);
  await new Promise((done) => {  // the worklet's last partial block
    const timeout = setTimeout(done, 500);
    r.node.port.addEventListener("message", (e) => { if (e.data === "flushed") { clearTimeout(timeout); done(); } });
    r.node.port.postMessage("flush");
  });
  r.stream.getTracks().forEach((track) => track.stop());
  r.source.disconnect();
  const rate = r.context.sampleRate;
  await r.context.close();
  const samples = concat(r.chunks);
  if (samples.length < rate * 0.3) {
    showError(t("tooshort"));
    return;
  }
  await sendVoice(wavFile(resample(samples, rate, SAMPLE_RATE), SAMPLE_RATE));
}

function micButton(recording) {
  const mic = $("mic");
  mic.textContent = t(recording ? "micstop" : "mic");
  mic.classList.toggle("recording", recording);
  mic.setAttribute("aria-pressed", String(recording));
  $("send").disabled = recording;
}

function concat(chunks) {
  const out = new Float32Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) { out.set(c, at); at += c.length; }
  return out;
}

// To ``to`` Hz by averaging each output sample's span of input samples: a box filter, enough
// against aliasing for speech going down from 44.1 or 48 kHz.
function resample(samples, from, to) {
  if (from === to) return samples;
  const ratio = from / to;
  const out = new Float32Array(Math.floor(samples.length / ratio));
  for (let i = 0; i < out.length; i++) {
    const start = Math.floor(i * ratio);
    const end = Math.max(start + 1, Math.floor((i + 1) * ratio));
    let sum = 0;
    for (let j = start; j < end; j++) sum += samples[j];
    out[i] = sum / (end - start);
  }
  return out;
}

// A WAV file: 16-bit PCM, mono.
function wavFile(samples, rate) {
  const buffer = new ArrayBuffer(44 + samples.length * 2);
  const v = new DataView(buffer);
  const text = (at, s) => { for (let i = 0; i < s.length; i++) v.setUint8(at + i, s.charCodeAt(i)); };
  text(0, "RIFF"); v.setUint32(4, 36 + samples.length * 2, true); text(8, "WAVE");
  text(12, "fmt "); v.setUint32(16, 16, true); v.setUint16(20, 1, true); v.setUint16(22, 1, true);
  v.setUint32(24, rate, true); v.setUint32(28, rate * 2, true); v.setUint16(32, 2, true); v.setUint16(34, 16, true);
  text(36, "data"); v.setUint32(40, samples.length * 2, true);
  for (let i = 0; i < samples.length; i++) {
    const x = Math.max(-1, Math.min(1, samples[i]));
    v.setInt16(44 + i * 2, x < 0 ? x * 0x8000 : x * 0x7fff, true);
  }
  return new Uint8Array(buffer);
}

function base64(bytes) {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

function init() {
  $("key").value = state.key;
  $("priority").checked = state.priority;
  $("tools").checked = state.tools;
  $("tools").addEventListener("change", () => { state.tools = $("tools").checked; save(); });
  $("key").addEventListener("change", () => { state.key = $("key").value.trim(); save(); discoverModel(); });
  $("priority").addEventListener("change", () => { state.priority = $("priority").checked; save(); });
  $("lang").addEventListener("click", () => { state.lang = state.lang === "en" ? "zh" : "en"; save(); applyLanguage(); });
  $("settings-toggle").addEventListener("click", () => { $("settings").hidden = !$("settings").hidden; });
  $("new").addEventListener("click", () => { if (controller) controller.abort(); state.messages = []; save(); render(); });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("mic").addEventListener("click", () => { if (recorder) stopRecording(); else if (!controller) startRecording(); });
  $("form").addEventListener("submit", (e) => {
    e.preventDefault();
    const q = $("input").value.trim();
    if (!q || controller || recorder) return;
    $("input").value = "";
    send(q);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("form").requestSubmit(); }
  });
  // An answer cut off by a reload is kept as far as it came; a spoken question not yet heard is dropped.
  state.messages = state.messages.filter((m) => !m.pending);
  state.messages.forEach((m) => { m.streaming = false; });
  applyLanguage();
  discoverModel();
  $("input").focus();
}

init();
