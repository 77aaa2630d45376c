// The official client of the MCP Tasks extension (@modelcontextprotocol/ext-tasks)
// against two /mcp replicas. Used by TestMCPTasksExtensionOfficialClient:
//   node mcp-ext-tasks-client.mjs <sdk dir> <url a> <url b>
// It prints one JSON line per step:
//   - 2026-07-28 (the extension, "v2"): a call started on replica a becomes a task;
//     the client hands its reference off and closes, a new session on replica b
//     resumes it and settles it; another task is cancelled on replica b;
//   - 2025-11-25 ("v1"): a call run as a task on replica a, then tasks/list on b.
import path from 'node:path';

const [sdkDir, urlA, urlB] = process.argv.slice(2);
const { withTasks, resultFromTaskOutcome } = await import(
  path.join(sdkDir, 'node_modules/@modelcontextprotocol/ext-tasks/dist/client/index.js'));
const say = (step, v) => console.log(JSON.stringify({ step, ...v }));

let id = 0;
const sent = [];

// post sends one JSON-RPC request and decodes its answer, whether JSON or
// an event stream.
async function post(url, req, headers, signal) {
  const resp = await fetch(url, {
    method: 'POST', body: JSON.stringify(req), signal,
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
  });
  let text = await resp.text();
  if ((resp.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
    text = text.split('\n').filter((l) => l.startsWith('data: ') && l.includes('"id"')).at(-1).slice('data: '.length);
  }
  const msg = JSON.parse(text);
  sent.push({ method: req.method, replica: url === urlA ? 'a' : 'b', resultType: msg.result?.resultType ?? null,
    status: msg.result?.status ?? null, error: msg.error?.code ?? null });
  return msg;
}

// A port is how the package reaches a server. route picks the replica of
// each request; v2 frames each as 2026-07-28 says (the _meta triple and
// the Mcp-* headers), v1 as a client of 2025-11-25 does.
function port(generation, capabilities, route) {
  return {
    endpointId: 'toolrelay-test',
    taskCapabilities: { generation, capabilities },
    async dispatch(request, options) {
      const req = { jsonrpc: '2.0', id: ++id, ...structuredClone(request) };
      req.params = req.params ?? {};
      const headers = {};
      if (generation === 'v2') {
        req.params._meta = {
          ...(req.params._meta ?? {}),
          'io.modelcontextprotocol/protocolVersion': '2026-07-28',
          'io.modelcontextprotocol/clientInfo': { name: 'toolrelay-ext-tasks-test', version: '1' },
          'io.modelcontextprotocol/clientCapabilities': { extensions: { 'io.modelcontextprotocol/tasks': {} } },
        };
        headers['mcp-protocol-version'] = '2026-07-28';
        headers['mcp-method'] = req.method;
        const name = req.params.name ?? req.params.taskId;
        if (name) headers['mcp-name'] = name;
      } else {
        headers['mcp-protocol-version'] = '2025-11-25';
      }
      const msg = await post(route(req.method), req, headers, options?.signal);
      return msg.error ? { kind: 'error', error: msg.error } : { kind: 'result', result: msg.result };
    },
    onServerRequest() { return () => {}; },
    onNotification() { return () => {}; },
    onInvalidated() { return () => {}; },
    invalidated: false,
  };
}

try {
  // 2026-07-28: a task started on a, its reference handed off, resumed on b.
  const first = withTasks(port('v2', {}, () => urlA));
  const report = await first.callTool('gate', {});
  say('called', { tool: 'gate', kind: report.kind, taskId: report.handle?.taskId ?? null });
  let reference;
  await report.handoff((r) => { reference = r; });
  // The client goes away: no more requests from this session. (Its close()
  // would cancel the task: ext-tasks 0.2.2 cancels an unsettled execution
  // it closes, handed off or not.)
  say('handedOff', { taskId: reference.taskId, generation: reference.generation });
  const second = withTasks(port('v2', {}, () => urlB));
  const resumed = await second.resumeTask(reference);
  const { outcome } = await resumed.settle();
  say('result', { text: resultFromTaskOutcome(outcome).content?.[0]?.text ?? null });

  // 2026-07-28: a task started on a, cancelled on b.
  const wait = await withTasks(port('v2', {}, (m) => (m.startsWith('tasks/') ? urlB : urlA))).callTool('wait', { tag: 'ts' });
  say('called', { tool: 'wait', kind: wait.kind, taskId: wait.handle?.taskId ?? null });
  await wait.cancel();
  say('cancelled', {});
  await second.close();

  // 2025-11-25: a task-augmented call on a, listed on b.
  const init = await post(urlA, { jsonrpc: '2.0', id: ++id, method: 'initialize', params: {
    protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'toolrelay-ext-tasks-test', version: '1' } } }, {});
  const v1 = withTasks(port('v1', init.result.capabilities.tasks, (m) => (m.startsWith('tasks/') ? urlB : urlA)));
  const echo = await v1.callTool('echo', { n: 7 }, { task: { preference: 'require' } });
  say('called', { tool: 'echo', kind: echo.kind, taskId: echo.handle?.taskId ?? null });
  const settled = await echo.settle();
  say('result', { text: resultFromTaskOutcome(settled.outcome).content?.[0]?.text ?? null });
  const page = await v1.listTasks();
  say('listed', { inventory: v1.capabilities.inventory, taskIds: page.tasks.map((t) => t.taskId) });
  await v1.close();
} catch (e) {
  say('error', { message: String(e), cause: String(e.cause ?? '') });
  process.exitCode = 1;
} finally {
  say('sent', { sent });
}
