/* Muster console: live updates over server-sent events, and confirmation of
   destructive forms. No inline scripts (the CSP allows only 'self').

   Live updates: the page's live element (#live) carries
     data-sse     the event-stream URL,
     data-sse-on  the event names that should refresh it (job, host, stats),
     data-sse-id  optionally, the one job or host id it shows (job/host events for
                  other ids are then ignored),
   and its own htmx attributes (hx-get, hx-select, hx-swap) with hx-trigger="every 2s".
   While the event stream is open, that 2 s poll is suppressed and #live is refreshed
   only when an event says something it shows changed (at most once a second); when the
   stream is down (no EventSource, a buffering proxy, a server restart) polling resumes.

   When the stream opens (and opens again), #live is refreshed once: what changed
   between the page's render and the stream's start (an action just taken, applied by the
   leader a moment later) is not missed.

   A live element with data-poll keeps its 2 s poll even while the stream is open: what
   it shows changes with no event saying so (a running try's output so far and how busy
   its GPUs are, on a job's page; the server sets it only while a try runs).

   A hidden tab holds no stream: it is closed when the tab is hidden and opened again
   (#live refreshed once) when it is shown, and #live is not polled meanwhile. Found by
   exploring: each tab held one, and with six console tabs open the browser's six
   connections per host were all taken, so the whole console hung.

   Action forms: a page's #actions (data-for) was rendered for a version of what it acts
   on; when a refresh of #live (data-version) says it changed, #actions is fetched again,
   unless a field in it is being filled in (then it says the page is out of date).

   Confirmation: a form with data-confirm="question" asks that question (with the
   reason typed) before it is sent. */
(function () {
  "use strict";

  // ------------------------------------------------------------ confirmation

  document.addEventListener("submit", function (evt) {
    var form = evt.target;
    if (!(form instanceof HTMLFormElement)) return;
    var question = form.getAttribute("data-confirm");
    if (!question) return;
    var reason = form.querySelector("[name=reason]");
    var text = question;
    if (reason && reason.value.trim()) text += "\n\nReason: " + reason.value.trim();
    if (!window.confirm(text)) evt.preventDefault();
  });

  // ------------------------------------------------------------ live updates

  var MIN_GAP_MS = 1000;
  var source = null;
  var streamOpen = false;
  var lastMessage = 0;
  var SILENT_MS = 15000;  // the server sends `stats` every <= 5 s: silence means a stuck stream
  var lastRefresh = 0;
  var timer = null;

  function liveElt() {
    return document.getElementById("live");
  }

  function refresh() {
    timer = null;
    var el = liveElt();
    if (!el || !window.htmx) return;
    if (document.hidden) {  // refresh once the tab is visible again
      document.addEventListener("visibilitychange", schedule, { once: true });
      return;
    }
    lastRefresh = Date.now();
    window.htmx.ajax("GET", el.getAttribute("hx-get"), {
      source: el,
      target: el,
      swap: "outerHTML",
      select: "#live",
      event: new CustomEvent("muster:sse")
    });
  }

  function schedule() {
    if (timer !== null) return;
    var wait = Math.max(0, lastRefresh + MIN_GAP_MS - Date.now());
    timer = window.setTimeout(refresh, wait);
  }

  // Suppress the 2 s poll of #live while the stream is open (unless #live asks for it:
  // data-poll), and while the tab is hidden (it is refreshed once when shown again).
  document.addEventListener("htmx:confirm", function (evt) {
    var d = evt.detail || {};
    if (!d.elt || d.elt.id !== "live") return;
    if (d.triggeringEvent && d.triggeringEvent.type === "muster:sse") return;
    if (document.hidden) {
      evt.preventDefault();
      return;
    }
    if (!streamOpen || d.elt.hasAttribute("data-poll")) return;
    if (Date.now() - lastMessage > SILENT_MS) return;  // e.g. a buffering proxy: keep polling
    evt.preventDefault();
  });

  // A refresh replaces #live; landing between the press and the release of a click on
  // a link inside it, it would swallow the click. While a pointer is down inside #live,
  // a refresh is not swapped in (the next one comes within seconds).
  var pressed = false;
  document.addEventListener("pointerdown", function (evt) {
    var el = liveElt();
    pressed = !!(el && el.contains(evt.target));
  }, true);
  ["pointerup", "pointercancel"].forEach(function (name) {
    document.addEventListener(name, function () {
      window.setTimeout(function () { pressed = false; }, 0);  // after the click fired
    }, true);
  });
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var d = evt.detail || {};
    if (pressed && d.target && d.target.id === "live" && d.requestConfig &&
        d.requestConfig.verb === "get") {
      d.shouldSwap = false;
    }
  });

  // ------------------------------------------------------------ action forms

  function busy(area) {
    var fields = area.querySelectorAll("input, select, textarea");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f === document.activeElement) return true;
      if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) return true;
      } else if (f.type !== "hidden" && f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }

  // The live part's version last acted on: #actions is fetched again only when that moves
  // (its own fetch may carry a newer version than #live has yet: no fetch loop).
  var seenVersion = null;

  document.addEventListener("htmx:afterSettle", function (evt) {
    var live = liveElt();
    var area = document.getElementById("actions");
    if (!live || !area || !window.htmx) return;
    var now = live.getAttribute("data-version");
    if (seenVersion === null) seenVersion = area.getAttribute("data-for");
    if (!now || now === seenVersion) return;
    if (now === area.getAttribute("data-for")) {
      seenVersion = now;
      return;
    }
    if (busy(area)) {  // (fetched at a later refresh once the field is left)
      if (!area.querySelector(".stale-note")) {
        var note = document.createElement("p");
        note.className = "stale-note notice";
        note.setAttribute("role", "status");
        note.textContent = "This has changed since the page was loaded: reload before acting on it.";
        area.insertBefore(note, area.firstChild);
      }
      return;
    }
    seenVersion = now;
    window.htmx.ajax("GET", live.getAttribute("hx-get"), {
      source: area, target: area, swap: "outerHTML", select: "#actions"
    });
  });

  // Open the page's event stream (once: not while one is open, nor in a hidden tab);
  // whether one was opened.
  function start() {
    var el = liveElt();
    if (source || document.hidden || !el || !window.EventSource) return false;
    var url = el.getAttribute("data-sse");
    if (!url) return false;
    var wanted = (el.getAttribute("data-sse-on") || "").split(/\s+/).filter(Boolean);
    source = new window.EventSource(url);
    source.addEventListener("stats", function () { lastMessage = Date.now(); });
    source.addEventListener("open", function () {
      lastMessage = Date.now();
      streamOpen = true;
      document.documentElement.setAttribute("data-live", "sse");
      schedule();  // what changed before the stream was open (found by exploring)
    });
    source.addEventListener("error", function () {
      // The browser reconnects by itself; poll meanwhile.
      streamOpen = false;
      document.documentElement.setAttribute("data-live", "poll");
    });
    wanted.forEach(function (name) {
      source.addEventListener(name, function (msg) {
        lastMessage = Date.now();
        var only = (liveElt() || el).getAttribute("data-sse-id");
        if (only && name !== "stats") {
          var data = null;
          try { data = JSON.parse(msg.data); } catch (e) { data = null; }
          // A host page also shows the jobs on it: refresh on any job event then.
          if (data && data.id !== only && !(name === "job" && wanted.indexOf("host") >= 0)) return;
        }
        schedule();
      });
    });
    source.addEventListener("resync", schedule);
    source.addEventListener("signout", function () {
      stop();
      window.location.reload();
    });
    return true;
  }

  function stop() {
    if (source) source.close();
    source = null;
    streamOpen = false;
  }

  window.addEventListener("pagehide", stop);
  window.addEventListener("pageshow", function (evt) {  // back from the back-forward cache
    if (evt.persisted && !start()) schedule();
  });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      stop();
      document.documentElement.setAttribute("data-live", "hidden");
    } else if (!start()) {  // (an opened stream refreshes #live when it opens)
      schedule();
    }
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
