// NIM amounts as people read them: an exact decimal string (as the API gives
// it, e.g. "99.999999999999999997") rounded half up to a few decimals
// ("100"), or to a few significant digits when it is below one
// ("0.00001235"). The exact amount stays in the JSON (and in the dashboard's
// tooltips); this is only for display. No imports: the dashboard bundles it.

/** Decimals shown for amounts of at least 1 NIM; significant digits below that. */
export const NIM_DISPLAY_DIGITS = 4;

/** `amount` (a decimal string, optionally negative) rounded for display; anything else is returned as given. */
export function displayNim(amount: string, digits: number = NIM_DISPLAY_DIGITS): string {
  const m = /^(-?)([0-9]+)(?:\.([0-9]+))?$/.exec(amount.trim());
  if (!m || !Number.isInteger(digits) || digits < 0 || digits > 30) return amount;
  const [, sign, wholeRaw, fracRaw = ''] = m;
  const whole = wholeRaw.replace(/^0+(?=\d)/, '');
  let places = digits;
  if (whole === '0') {
    // below one: keep `digits` significant digits after the leading zeros
    const zeros = /^0*/.exec(fracRaw)![0].length;
    if (zeros === fracRaw.length) return '0';
    places = zeros + digits;
  }
  const rounded = roundDecimal(whole, fracRaw, places);
  return rounded === '0' ? '0' : `${sign}${rounded}`;
}

/** whole.frac rounded half up to `places` decimals, trailing zeros dropped. */
function roundDecimal(whole: string, frac: string, places: number): string {
  const padded = (frac + '0'.repeat(places + 1)).slice(0, places + 1);
  let digits = BigInt(whole + padded.slice(0, places));
  if (Number(padded[places]) >= 5) digits += 1n;
  const s = digits.toString().padStart(places + 1, '0');
  const intPart = s.slice(0, s.length - places) || '0';
  const fracPart = s.slice(s.length - places).replace(/0+$/, '');
  return fracPart ? `${intPart}.${fracPart}` : intPart;
}
