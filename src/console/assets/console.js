// pgwake console: refresh the parts of a page marked data-refresh (a URL
// of the same console) every data-every milliseconds, while the tab is
// visible. The fragment is server-rendered and escaped like every page.
(function () {
  document.querySelectorAll("[data-refresh]").forEach(function (el) {
    var every = parseInt(el.getAttribute("data-every"), 10) || 3000;
    var url = el.getAttribute("data-refresh");
    setInterval(function () {
      if (document.hidden) { return; }
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) { el.innerHTML = html; } })
        .catch(function () {});
    }, every);
  });
})();
