// What a child process this project starts (a miner of `nbcli up`, the local
// anvil chain node) sees of its parent's environment: an allowlist, never a
// copy of `process.env`, so that a secret in the parent's environment (a
// cloud key, a wallet password, a token) does not leak to a child that does
// not need it, nor to whatever reads that child's /proc/<pid>/environ or
// its crash reports. A child that needs more gets it by name from its parent
// (e.g. NIMBLE_PASSWORD, only to a miner that unlocks a wallet).
// Kept in the protocol layer (the lowest) so src/chain and src/cli share it.

/**
 * Variables a child inherits when the parent has them: where programs and
 * the home and temp folders are, locale and time zone, the terminal, Node's
 * own options and certificates, Nimble's data folder and debug switch, and
 * what Windows needs to start a process. Nothing secret.
 */
export const CHILD_ENV_ALLOWLIST: readonly string[] = [
  'PATH',
  'HOME',
  'USER',
  'LOGNAME',
  'SHELL',
  'TMPDIR',
  'TMP',
  'TEMP',
  'LANG',
  'LANGUAGE',
  'LC_ALL',
  'LC_CTYPE',
  'LC_MESSAGES',
  'LC_NUMERIC',
  'TZ',
  'TERM',
  'NO_COLOR',
  'FORCE_COLOR',
  'NODE_OPTIONS',
  'NODE_PATH',
  'NODE_EXTRA_CA_CERTS',
  'NIMBLE_HOME',
  'NIMBLE_DEBUG',
  'SYSTEMROOT',
  'SystemRoot',
  'WINDIR',
  'COMSPEC',
  'PATHEXT',
  'USERPROFILE',
  'APPDATA',
  'LOCALAPPDATA',
];

/**
 * The environment of a child: the allowlisted variables of `parent`, then
 * `extra` (a value of undefined removes the variable).
 */
export function childEnv(extra: Readonly<Record<string, string | undefined>> = {}, parent: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const name of CHILD_ENV_ALLOWLIST) {
    const v = parent[name];
    if (v !== undefined) env[name] = v;
  }
  for (const [name, v] of Object.entries(extra)) {
    if (v === undefined) delete env[name];
    else env[name] = v;
  }
  return env;
}
