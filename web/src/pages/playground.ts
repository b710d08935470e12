// The Playground page: a completion streamed from a deployed model through
// its miners, as any OpenAI client gets it (POST /v1/completions with
// stream), or in chat mode a conversation (POST /v1/chat/completions, the
// model's chat template: a system message, then each message sent with the
// turns before it), paid with the API key typed here (nbcli api-key create
// makes one; the page keeps it in this form only). The text arrives as text
// nodes.
import { fill, h } from '../dom.ts';
import { type ChatMessage, CompletionError, streamChat, streamCompletion } from '../completion.ts';
import { livePage, type Page, type PageContext } from './page.ts';

function numberInput(id: string, value: number, min: number, max: number, step: number): HTMLInputElement {
  const el = h('input', { id, type: 'number' });
  el.value = String(value);
  el.min = String(min);
  el.max = String(max);
  el.step = String(step);
  return el;
}

export function playgroundPage(root: HTMLElement, ctx: PageContext): Page {
  const model = h('select', { id: 'pg-model' });
  const prompt = h('textarea', { id: 'pg-prompt' });
  prompt.rows = 4;
  prompt.value = 'Call me Ishmael. ';
  const maxTokens = numberInput('pg-max-tokens', 64, 1, 4096, 1);
  const temperature = numberInput('pg-temperature', 0.8, 0, 2, 0.1);
  const seed = numberInput('pg-seed', 0, 0, 2 ** 31 - 1, 1);
  const key = h('input', { id: 'pg-key', type: 'password' });
  key.autocomplete = 'off';
  key.placeholder = 'nk-… (nbcli api-key create)';
  const mode = h('select', { id: 'pg-mode' }, h('option', null, 'completion'), h('option', null, 'chat'));
  const system = h('textarea', { id: 'pg-system' });
  system.rows = 2;
  system.placeholder = 'system message (optional)';
  const systemLabel = h('label', null, h('span', null, 'system'), system);
  /** the chat's turns so far (chat mode) */
  const turns: ChatMessage[] = [];
  const conversation = h('div', { id: 'pg-conversation', class: 'conversation' });
  const clear = h('button', { type: 'button', id: 'pg-clear', on: { click: () => (turns.splice(0), fill(conversation), fill(output)) } }, 'New chat');
  const showMode = (): void => {
    const chat = mode.value === 'chat';
    systemLabel.hidden = !chat;
    conversation.hidden = !chat;
    clear.hidden = !chat;
    go.textContent = chat ? 'Send' : 'Generate';
    if (chat && prompt.value === 'Call me Ishmael. ') prompt.value = 'Who are you?';
  };
  mode.addEventListener('change', showMode);
  const output = h('pre', { id: 'pg-output', class: 'completion' });
  const status = h('p', { id: 'pg-status', class: 'muted' });
  let controller: AbortController | null = null;
  const stop = h('button', { type: 'button', id: 'pg-stop', disabled: true, on: { click: () => controller?.abort() } }, 'Stop');
  const go = h('button', { type: 'button', id: 'pg-generate', on: { click: () => void generate() } }, 'Generate');

  async function generate(): Promise<void> {
    if (!model.value) return ctx.notify('no deployed model is serving yet', true);
    if (!key.value.trim()) return ctx.notify('an API key is needed: nbcli api-key create --name playground', true);
    const request = { model: model.value, prompt: prompt.value, max_tokens: Number(maxTokens.value), temperature: Number(temperature.value), seed: Number(seed.value) };
    const chat = mode.value === 'chat';
    const messages: ChatMessage[] = [...(system.value.trim() ? [{ role: 'system' as const, content: system.value }] : []), ...turns, { role: 'user', content: prompt.value }];
    controller = new AbortController();
    ctx.notify('');
    fill(output);
    output.dataset.state = 'running';
    fill(status, 'generating…');
    go.disabled = true;
    stop.disabled = false;
    const t0 = performance.now();
    try {
      const onText = (text: string): void => output.append(text);
      const { prompt: _p, ...sampling } = request;
      const r = chat ? await streamChat({ ...sampling, messages }, key.value.trim(), onText, controller.signal) : await streamCompletion(request, key.value.trim(), onText, controller.signal);
      output.dataset.state = 'done';
      if (chat) {
        // the turn joins the conversation shown above the answer box
        turns.push({ role: 'user', content: prompt.value }, { role: 'assistant', content: r.text });
        conversation.append(h('p', { class: 'turn user' }, h('b', null, 'user: '), prompt.value), h('p', { class: 'turn assistant' }, h('b', null, 'assistant: '), r.text));
        prompt.value = '';
      }
      const s = (performance.now() - t0) / 1000;
      fill(status, `${r.finishReason === 'stop' ? 'ended at a stop sequence or the end of its turn' : r.finishReason === 'length' ? `ended at ${request.max_tokens} tokens` : 'ended'} · ${r.chunks} chunks in ${s.toFixed(1)} s`);
    } catch (err) {
      output.dataset.state = 'error';
      const aborted = controller?.signal.aborted;
      fill(status, aborted ? 'stopped' : '');
      if (!aborted) ctx.notify(err instanceof CompletionError ? `${err.status}: ${err.message}` : (err as Error).message, true);
    } finally {
      controller = null;
      go.disabled = false;
      stop.disabled = true;
    }
  }

  const label = (text: string, control: HTMLElement): HTMLLabelElement => h('label', null, h('span', null, text), control);
  fill(
    root,
    h('h1', null, 'Playground'),
    h('p', { class: 'muted' }, 'A completion or a chat from a deployed model, generated stage by stage by the miners serving it and paid per token with your API key.'),
    h('div', { class: 'playground' }, h('div', { class: 'row' }, label('model', model), label('mode', mode)), systemLabel, conversation, label('prompt', prompt), h('div', { class: 'row' }, label('max tokens', maxTokens), label('temperature', temperature), label('seed', seed)), label('API key', key), h('div', { class: 'actions' }, go, ' ', stop, ' ', clear)),
    output,
    status,
  );
  showMode();
  const live = livePage(ctx, ['deployments'], () => {
    const serving = (ctx.feed.store.deployments ?? []).filter((d) => d.status === 'serving').map((d) => d.name);
    const chosen = model.value;
    fill(model, serving.length ? serving.map((name) => h('option', null, name)) : h('option', { disabled: true }, 'no model is serving'));
    if (serving.includes(chosen)) model.value = chosen;
  });
  return {
    dispose: () => {
      live.dispose();
      controller?.abort();
    },
  };
}
