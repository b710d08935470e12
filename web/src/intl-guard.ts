// Runs before anything else on the page (main.ts imports it first): a browser
// may report a language that its own Intl refuses (a headless Chromium on a
// POSIX locale reports "en-US@posix"), and uPlot builds an
// Intl.NumberFormat(navigator.language) when its module loads, which then
// throws and leaves the page blank. Such a language is replaced, for this
// page only, by the nearest tag Intl takes: the same without its "@…"
// variant, else "en-US".
function accepted(tag: string): boolean {
  try {
    new Intl.NumberFormat(tag);
    return true;
  } catch {
    return false;
  }
}

const reported = navigator.language;
if (!accepted(reported)) {
  const base = reported.split('@')[0];
  const language = accepted(base) ? base : 'en-US';
  Object.defineProperty(navigator, 'language', { configurable: true, get: () => language });
  Object.defineProperty(navigator, 'languages', { configurable: true, get: () => [language] });
}

export {};
