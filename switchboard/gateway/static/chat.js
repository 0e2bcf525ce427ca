// Switchboard web chat: OpenAI's Chat Completions API of this gateway, streamed (server-sent
// events over fetch), the conversation kept in localStorage. No dependencies; text is only
// ever set as textContent.
"use strict";

const STORE = "switchboard.chat.v1";
const T = {
  en: { agent: "Agent (priority 1)", settings: "Settings", new: "New conversation", key: "API key",
        keyhint: "Kept in this browser only (localStorage).", send: "Send", stop: "Stop", stats: "stats",
        placeholder: "Ask about an order, a refund, delivery… (Enter sends, Shift+Enter: new line)",
        reused: "reused", of: "of", prompt: "prompt tokens", ttft: "time to first token", server: "server",
        tokens: "tokens", faq: "FAQ answer", p1: "priority 1", stopped: "(stopped)", lang: "中文" },
  zh: { agent: "客服（优先级 1）", settings: "设置", new: "新对话", key: "API 密钥",
        keyhint: "只保存在本浏览器（localStorage）。", send: "发送", stop: "停止", stats: "统计",
        placeholder: "询问订单、退款、配送……（回车发送，Shift+回车换行）",
        reused: "复用", of: "/", prompt: "个提示词元", ttft: "首字时间", server: "服务端",
        tokens: "个词元", faq: "常见问题答案", p1: "优先级 1", stopped: "（已停止）", lang: "English" },
};

const $ = (id) => document.getElementById(id);
let state = load();
let controller = null;

function load() {
  try {
    const s = JSON.parse(localStorage.getItem(STORE) || "{}");
    return { messages: Array.isArray(s.messages) ? s.messages : [], key: s.key || "",
             priority: !!s.priority, lang: s.lang === "zh" ? "zh" : "en" };
  } catch (e) {
    return { messages: [], key: "", priority: false, lang: "en" };
  }
}
function save() { localStorage.setItem(STORE, JSON.stringify(state)); }
function t(k) { return T[state.lang][k]; }

function applyLanguage() {
  document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
  document.querySelectorAll("[data-i18n]").forEach((el) => { el.textContent = t(el.dataset.i18n); });
  $("lang").textContent = t("lang");
  $("input").placeholder = t("placeholder");
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
  if (s.fallback) parts.push(t("faq"));
  return parts.join(" · ");
}

function bubble(m, i) {
  const div = document.createElement("div");
  div.className = `msg ${m.role}` + (m.streaming ? " streaming" : "");
  div.dataset.testid = `msg-${m.role}`;
  div.dataset.index = String(i);
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = m.content;
  div.appendChild(text);
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

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("input").disabled = on;
}

async function send(question) {
  showError("");
  const history = state.messages.filter((m) => m.content).map((m) => ({ role: m.role, content: m.content }));
  history.push({ role: "user", content: question });
  const priority = state.priority ? 1 : 2;
  state.messages.push({ role: "user", content: question });
  const answer = { role: "assistant", content: "", streaming: true, priority };
  state.messages.push(answer);
  render();
  const headers = { "Content-Type": "application/json", "X-Switchboard-Stats": "1",
                    "X-Switchboard-Priority": String(priority) };
  if (state.key) headers.Authorization = `Bearer ${state.key}`;
  controller = new AbortController();
  busy(true);
  const t0 = performance.now();
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers, signal: controller.signal,
      body: JSON.stringify({ model: window.SWITCHBOARD_MODEL || "switchboard", messages: history, stream: true,
                             stream_options: { include_usage: true } }),
    });
    if (!response.ok) {
      let message = `HTTP ${response.status}`;
      try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(message);
    }
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      for (const c of chunk.choices || []) {
        const text = c.delta && c.delta.content;
        if (text) {
          if (answer.ttft_ms === undefined) answer.ttft_ms = performance.now() - t0;
          answer.content += text;
          const last = $("log").lastElementChild;
          if (last) last.querySelector(".text").textContent = answer.content;
        }
      }
      if (chunk.usage) answer.stats = { ...(chunk.switchboard || {}), prompt_tokens: chunk.usage.prompt_tokens,
        reused_tokens: chunk.usage.prompt_tokens_details ? chunk.usage.prompt_tokens_details.cached_tokens : 0 };
    });
  } catch (e) {
    if (e.name === "AbortError") {
      answer.content += " " + t("stopped");
    } else {
      showError(e.message);
      if (!answer.content) state.messages.splice(-2, 2);  // nothing answered: the question can be sent again
    }
  } finally {
    answer.streaming = false;
    controller = null;
    busy(false);
    save();
    render();
    $("input").focus();
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

function init() {
  $("key").value = state.key;
  $("priority").checked = state.priority;
  $("key").addEventListener("change", () => { state.key = $("key").value.trim(); save(); discoverModel(); });
  $("priority").addEventListener("change", () => { state.priority = $("priority").checked; save(); });
  $("lang").addEventListener("click", () => { state.lang = state.lang === "en" ? "zh" : "en"; save(); applyLanguage(); });
  $("settings-toggle").addEventListener("click", () => { $("settings").hidden = !$("settings").hidden; });
  $("new").addEventListener("click", () => { if (controller) controller.abort(); state.messages = []; save(); render(); });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("form").addEventListener("submit", (e) => {
    e.preventDefault();
    const q = $("input").value.trim();
    if (!q || controller) return;
    $("input").value = "";
    send(q);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("form").requestSubmit(); }
  });
  // An answer cut off by a reload is kept as far as it came.
  state.messages.forEach((m) => { m.streaming = false; });
  applyLanguage();
  discoverModel();
  $("input").focus();
}

init();
