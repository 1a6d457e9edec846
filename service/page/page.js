// The translator page. It speaks only to this service's own API (/page/settings,
// /languages, /translate), as any client does; choices and the key stay in this browser.

const $ = (id) => document.getElementById(id);
const DEBOUNCE_MS = 250; // a pause in typing this long sends the text
const ALTERNATIVES = 3; // offered for a sentence, within the service's MAX_BEAM

let settings = { key_required: false, max_chars: 10000, max_beam: 8 };
let pairs = []; // [{source_lang, target_lang, pivot_lang?}] from /languages
let current = null; // the translation shown: its sentences, separators and pair
let inflight = null; // AbortController of the translation request under way
let timer = 0;
let lastInput = 0; // performance.now() at the last keystroke, for the latency measure
let menuFor = null; // the sentence whose alternatives are open

const stored = {
  get(name) {
    try { return localStorage.getItem(name); } catch { return null; }
  },
  set(name, value) {
    try { localStorage.setItem(name, value); } catch { /* private mode: not remembered */ }
  },
};

const displayNames = (() => {
  try {
    return new Intl.DisplayNames([navigator.language, "en"], { type: "language" });
  } catch {
    return null;
  }
})();

function languageName(code) {
  try {
    const name = displayNames?.of(code);
    if (name && name !== code) return name;
  } catch { /* a code Intl does not know */ }
  return code;
}

const number = (n) => n.toLocaleString();

class ServiceError extends Error {
  constructor(message, status = 0, code = "", retryAfter = 0) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

function headers(json) {
  const result = json ? { "Content-Type": "application/json" } : {};
  const key = $("api-key").value.trim();
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

async function call(path, body, signal) {
  let init;
  if (body === undefined) init = { headers: headers(false), signal };
  else if (body instanceof FormData) init = { method: "POST", headers: headers(false), body };
  else init = { method: "POST", headers: headers(true), body: JSON.stringify(body), signal };
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ServiceError("The service cannot be reached. Check the connection and try again.");
  }
  let payload = null;
  try { payload = await response.json(); } catch { /* not JSON: explained by status */ }
  if (response.ok) return payload;
  const code = payload?.error?.code ?? "";
  const wait = Number(response.headers.get("Retry-After")) || 0;
  throw new ServiceError(explain(response.status, code, payload?.error?.message, wait),
    response.status, code, wait);
}

// Each refusal in plain words; the service's own message only where no better one is known.
function explain(status, code, message, wait) {
  const again = wait > 0
    ? ` Try again in ${wait} second${wait === 1 ? "" : "s"}.`
    : " Try again in a moment.";
  switch (status) {
    case 401:
      return $("api-key").value.trim()
        ? "The API key was not accepted. Check it and try again."
        : "This service needs an API key: enter yours above.";
    case 403:
      return "This API key has used up its allowance.";
    case 413:
      if (code === "document_too_large") return message;
      if (code === "too_many_sentences") return "The text has too many sentences for one "
        + "request: translate it in parts.";
      if (code === "over_rate_limit") return "The text is more than this key may translate in "
        + "a minute: translate it in parts.";
      return `The text is too long: at most ${number(settings.max_chars)} characters at once.`;
    case 429:
      if (code === "too_many_failed_keys") return "Too many wrong API keys were tried." + again;
      return (code === "queue_full" ? "The service is busy." : "Too many requests.") + again;
    case 503:
      if (code === "not_ready") return "The service is starting; the translation follows as "
        + "soon as it is ready.";
      return "The service is busy or restarting." + again;
    case 504:
      return "The translation took too long. Try a shorter text.";
    default:
      break;
  }
  if (code === "unsupported_language_pair" || code === "ambiguous_language_pair") {
    return "This language pair is not available, or the language was not recognised: "
      + "choose the source language.";
  }
  if (status >= 500) return "The service failed to translate this text. Try again.";
  return message || `The service refused the request (status ${status}).`;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

function setStatus(message) {
  $("status").textContent = message;
}

// Languages ---------------------------------------------------------------------------------

function sources() {
  return [...new Set(pairs.map((p) => p.source_lang))];
}

function targetsOf(source) {
  const matching = source === "auto" ? pairs : pairs.filter((p) => p.source_lang === source);
  return [...new Set(matching.map((p) => p.target_lang))];
}

function fill(select, codes, wanted, extra) {
  const options = codes
    .map((code) => [code, languageName(code)])
    .sort((a, b) => a[1].localeCompare(b[1]));
  if (extra) options.unshift(extra);
  select.replaceChildren(...options.map(([code, name]) => new Option(name, code)));
  const values = options.map(([code]) => code);
  select.value = values.includes(wanted) ? wanted : values[0] ?? "";
}

function fillTargets() {
  const source = $("source-lang").value;
  const wanted = $("target-lang").value || stored.get("target-lang");
  fill($("target-lang"), targetsOf(source).filter((t) => t !== source), wanted);
  updateSwap();
}

async function loadLanguages() {
  let answer;
  try {
    answer = await call("/languages");
  } catch (error) {
    showError(error.message);
    return false;
  }
  pairs = answer.pairs;
  if (!pairs.length) {
    setStatus("The service is starting…");
    setTimeout(() => loadLanguages().then((ok) => ok && translateNow()), 2000);
    return false;
  }
  setStatus("");
  showError("");
  const many = sources().length > 1;
  const wanted = $("source-lang").value || stored.get("source-lang")
    || (many ? "auto" : sources()[0]);
  fill($("source-lang"), sources(), wanted, ["auto", "Detect language"]);
  fillTargets();
  return true;
}

function sourceInUse() {
  const source = $("source-lang").value;
  return source === "auto" ? current?.source ?? null : source;
}

function updateSwap() {
  const source = sourceInUse();
  const target = $("target-lang").value;
  $("swap").disabled = !source || !pairs.some(
    (p) => p.source_lang === target && p.target_lang === source);
}

function swap() {
  const source = sourceInUse();
  const target = $("target-lang").value;
  const translated = $("translation").textContent;
  $("source-lang").value = target;
  fillTargets();
  $("target-lang").value = source;
  remember();
  if (translated) $("source-text").value = translated;
  updateCounter();
  translateNow();
}

function remember() {
  stored.set("source-lang", $("source-lang").value);
  stored.set("target-lang", $("target-lang").value);
}

// Translating -------------------------------------------------------------------------------

function characters(text) {
  return [...text].length; // code points, as the service counts
}

function updateCounter() {
  const count = characters($("source-text").value);
  const counter = $("counter");
  counter.textContent = `${number(count)} / ${number(settings.max_chars)}`;
  counter.classList.toggle("over", count > settings.max_chars);
}

function onInput() {
  lastInput = performance.now();
  updateCounter();
  clearTimeout(timer);
  inflight?.abort();
  inflight = null;
  timer = setTimeout(translateNow, DEBOUNCE_MS);
}

async function translateNow() {
  clearTimeout(timer);
  inflight?.abort();
  inflight = null;
  closeMenu();
  const text = $("source-text").value;
  const source = $("source-lang").value;
  const target = $("target-lang").value;
  if (!text.trim() || !target) {
    showError("");
    render(null);
    return;
  }
  const count = characters(text);
  if (count > settings.max_chars) {
    showError(`The text is too long: ${number(count)} characters, at most `
      + `${number(settings.max_chars)} at once. Shorten it by ${number(count - settings.max_chars)}.`);
    render(null);
    return;
  }
  const controller = new AbortController();
  inflight = controller;
  const output = $("translation");
  output.setAttribute("aria-busy", "true");
  const started = performance.now();
  try {
    const answer = await call("/translate", {
      text, source_lang: source, target_lang: target, return_sentences: true,
    }, controller.signal);
    if (inflight !== controller) return;
    inflight = null;
    showError("");
    current = {
      ...answer.translations[0],
      source: answer.source_lang,
      target: answer.target_lang,
      via: answer.pivot_lang ?? null,
    };
    render(current);
    const shown = performance.now();
    performance.measure("translation", { start: lastInput || started, end: shown });
    performance.measure("translation-request", { start: started, end: shown });
  } catch (error) {
    if (error.name === "AbortError" || inflight !== controller) return;
    inflight = null;
    output.setAttribute("aria-busy", "false");
    showError(error.message);
    if (error.status === 503 && error.code === "not_ready") {
      timer = setTimeout(translateNow, Math.max(1, error.retryAfter) * 1000);
    }
  }
}

function render(result) {
  const output = $("translation");
  output.setAttribute("aria-busy", "false");
  if (!result) current = null;
  const source = $("source-lang").value;
  $("detected").textContent = source === "auto" && result
    ? `Detected: ${languageName(result.source)}` : "";
  const pickable = settings.max_beam > 1;
  const nodes = [];
  result?.sentences.forEach((sentence, index) => {
    nodes.push(document.createTextNode(result.separators[index]));
    const span = document.createElement("span");
    span.className = "sentence";
    span.textContent = sentence.text;
    span.dataset.index = String(index);
    if (pickable) {
      span.tabIndex = 0;
      span.setAttribute("role", "button");
      span.setAttribute("aria-haspopup", "dialog");
      span.title = "Other translations";
    }
    nodes.push(span);
  });
  if (result) nodes.push(document.createTextNode(result.separators.at(-1)));
  output.replaceChildren(...nodes);
  $("copy").disabled = !result;
  $("hint").textContent = result && pickable ? "Click a sentence for other translations" : "";
  updateSwap();
}

// Alternatives ------------------------------------------------------------------------------

async function openMenu(span) {
  if (!current || settings.max_beam < 2) return;
  const sentence = current.sentences[Number(span.dataset.index)];
  const menu = $("alternatives");
  const list = $("alternatives-list");
  menuFor = span;
  const item = document.createElement("li");
  item.textContent = "Looking for other translations…";
  list.replaceChildren(item);
  place(menu, span);
  const wanted = Math.min(ALTERNATIVES, settings.max_beam - 1);
  let answer;
  try {
    answer = await call("/translate", {
      text: sentence.source, source_lang: current.via ?? current.source,
      target_lang: current.target, num_alternatives: wanted, beam_size: wanted + 1,
    });
  } catch (error) {
    if (menuFor === span) item.textContent = error.message;
    return;
  }
  if (menuFor !== span) return;
  const found = answer.translations[0];
  const choices = [...new Set([sentence.text, found.text,
    ...(found.alternatives ?? []).map((a) => a.text)])]
    .filter((text) => text !== span.textContent);
  if (!choices.length) {
    item.textContent = "No other translation.";
    return;
  }
  list.replaceChildren(...choices.map((text) => {
    const entry = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = text;
    button.addEventListener("click", () => {
      span.textContent = text;
      span.classList.toggle("chosen", text !== sentence.text);
      closeMenu();
    });
    entry.append(button);
    return entry;
  }));
  list.querySelector("button").focus();
}

function place(menu, span) {
  menu.hidden = false;
  const box = span.getBoundingClientRect();
  const width = menu.offsetWidth;
  const left = Math.max(8, Math.min(box.left, document.documentElement.clientWidth - width - 8));
  menu.style.left = `${left + window.scrollX}px`;
  menu.style.top = `${box.bottom + window.scrollY + 4}px`;
}

function closeMenu() {
  const span = menuFor;
  menuFor = null;
  $("alternatives").hidden = true;
  return span;
}

function onMenuKey(event) {
  const buttons = [...$("alternatives-list").querySelectorAll("button")];
  const at = buttons.indexOf(document.activeElement);
  if (event.key === "Escape") {
    closeMenu()?.focus();
  } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
    event.preventDefault();
    const step = event.key === "ArrowDown" ? 1 : -1;
    buttons[(at + step + buttons.length) % buttons.length]?.focus();
  } else if (event.key === "Tab") {
    closeMenu();
  }
}

// Files -------------------------------------------------------------------------------------

const POLL_MS = 400; // how often a document's status is asked for

async function translateFile(file) {
  const status = $("file-status");
  const link = $("file-download");
  link.hidden = true;
  showError("");
  const extension = file.name.slice(file.name.lastIndexOf(".")).toLowerCase();
  if (!settings.documents.includes(extension)) {
    showError(`This service translates ${settings.documents.join(", ")} files, not ${extension}.`);
    return;
  }
  const form = new FormData();
  form.append("file", file);
  form.append("target_lang", $("target-lang").value);
  if ($("source-lang").value !== "auto") form.append("source_lang", $("source-lang").value);
  status.textContent = `Uploading ${file.name}…`;
  let accepted;
  try {
    accepted = await call("/translate/document", form);
  } catch (error) {
    status.textContent = "";
    showError(error.message);
    return;
  }
  const where = `/translate/document/${accepted.document_id}`;
  const key = `document_key=${accepted.document_key}`;
  let state = accepted;
  while (state.status !== "done") {
    if (state.status === "error") {
      status.textContent = "";
      showError(`The file could not be translated: ${state.error}`);
      return;
    }
    status.textContent = `Translating ${file.name}…`;
    await new Promise((resolve) => { setTimeout(resolve, POLL_MS); });
    try {
      state = await call(`${where}?${key}`);
    } catch (error) {
      status.textContent = "";
      showError(error.message);
      return;
    }
  }
  let blob;
  try {
    const response = await fetch(`${where}/result?${key}`, { headers: headers(false) });
    if (!response.ok) throw new ServiceError("The translated file could not be downloaded.");
    blob = await response.blob();
  } catch (error) {
    status.textContent = "";
    showError(error.message);
    return;
  }
  const target = $("target-lang").value;
  const dot = file.name.lastIndexOf(".");
  link.download = `${file.name.slice(0, dot)}.${target}${file.name.slice(dot)}`;
  if (link.href) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(blob);
  link.textContent = `Download ${link.download}`;
  link.hidden = false;
  status.textContent = `${file.name} is translated.`;
  link.focus();
}

function startFiles() {
  if (!settings.documents?.length) return; // no document API: no control
  $("files").hidden = false;
  const input = $("file-input");
  input.accept = settings.documents.join(",");
  $("file-types").textContent = `(${settings.documents.join(", ")})`;
  input.addEventListener("change", () => {
    if (input.files.length) translateFile(input.files[0]);
    input.value = "";
  });
  const drop = $("file-drop");
  drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    if (event.dataTransfer.files.length) translateFile(event.dataTransfer.files[0]);
  });
}

// Copy --------------------------------------------------------------------------------------

async function copy() {
  const text = $("translation").textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // No clipboard API outside secure contexts (plain http to another host): select instead.
    const range = document.createRange();
    range.selectNodeContents($("translation"));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    document.execCommand("copy");
  }
  $("hint").textContent = "Copied";
}

// Start -------------------------------------------------------------------------------------

async function start() {
  try {
    settings = await call("/page/settings");
  } catch (error) {
    showError(error.message);
    return;
  }
  if (settings.key_required) {
    $("key-row").hidden = false;
    $("api-key").value = stored.get("api-key") ?? "";
  }
  updateCounter();
  $("source-text").addEventListener("input", onInput);
  $("source-lang").addEventListener("change", () => {
    fillTargets();
    remember();
    translateNow();
  });
  $("target-lang").addEventListener("change", () => {
    remember();
    translateNow();
  });
  $("swap").addEventListener("click", swap);
  $("copy").addEventListener("click", copy);
  $("api-key").addEventListener("change", async () => {
    stored.set("api-key", $("api-key").value.trim());
    if (await loadLanguages()) translateNow();
  });
  const output = $("translation");
  output.addEventListener("click", (event) => {
    const span = event.target.closest(".sentence");
    if (span) openMenu(span);
  });
  output.addEventListener("keydown", (event) => {
    const span = event.target.closest(".sentence");
    if (span && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      openMenu(span);
    }
  });
  $("alternatives").addEventListener("keydown", onMenuKey);
  document.addEventListener("click", (event) => {
    if (menuFor && !event.target.closest("#alternatives, .sentence")) closeMenu();
  });
  startFiles();
  if (await loadLanguages() && $("source-text").value) translateNow();
}

start();
