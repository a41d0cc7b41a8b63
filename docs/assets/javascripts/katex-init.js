// Render the math that pymdownx.arithmatex (generic mode) leaves as \( ... \) and \[ ... \] in
// span.arithmatex / div.arithmatex, with the KaTeX copy served from docs/assets/katex (no CDN).
// `document$` is Material's page-load observable (instant navigation included).
function renderMath(root) {
  for (const el of root.querySelectorAll(".arithmatex")) {
    renderMathInElement(el, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
}
if (typeof document$ !== "undefined") {
  document$.subscribe(({ body }) => renderMath(body));
} else {
  document.addEventListener("DOMContentLoaded", () => renderMath(document.body));
}
