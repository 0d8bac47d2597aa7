// Warden console: small progressive enhancements (the pages work without it).
// Focus the field a page marks, and single-key shortcuts to the sections
// (e, h, m, s, a) when no field has focus.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var first = document.querySelector("[data-autofocus]");
    if (first) { first.focus(); }
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) { return; }
    var t = ev.target;
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT|BUTTON)$/.test(t.tagName))) { return; }
    var link = document.querySelector('nav a[data-key="' + ev.key + '"]');
    if (link) { ev.preventDefault(); link.click(); }
  });
})();
