// The markers around the README's command reference (scripts/cli-reference.ts
// writes between them; ./readme.test.ts reads between them).
export const README_BEGIN = '<!-- nbcli reference: made by scripts/cli-reference.ts -->';
export const README_END = '<!-- end of nbcli reference -->';
