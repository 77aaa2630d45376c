// The official TypeScript MCP SDK's client against two /mcp replicas, its
// requests sent to each in turn. Used by TestMCPTypeScriptSDK:
//   node mcp-ts-client.mjs <sdk dir> <url a> <url b>
// It prints one JSON line per step.
import path from 'node:path';

const [sdkDir, ...urls] = process.argv.slice(2);
const esm = path.join(sdkDir, 'node_modules/@modelcontextprotocol/sdk/dist/esm');
const { Client } = await import(path.join(esm, 'client/index.js'));
const { StreamableHTTPClientTransport } = await import(path.join(esm, 'client/streamableHttp.js'));

let next = 0;
const roundRobin = (input, init) => {
  const url = urls[next++ % urls.length];
  return fetch(url, init);
};
const say = (step, v) => console.log(JSON.stringify({ step, ...v }));

const client = new Client({ name: 'toolrelay-ts-test', version: '1' });
await client.connect(new StreamableHTTPClientTransport(new URL(urls[0]), { fetch: roundRobin }));
say('connected', { version: client.getServerVersion()?.name, tasks: client.getServerCapabilities()?.tasks ?? null });
await client.listTools(); // tells the client which tools may run as tasks

// A task: created on one replica, polled and read on the others.
for await (const m of client.experimental.tasks.callToolStream({ name: 'echo', arguments: { n: 41 } }, undefined, { task: { ttl: 60000 } })) {
  if (m.type === 'taskCreated') say('taskCreated', { taskId: m.task.taskId, status: m.task.status });
  if (m.type === 'taskStatus') say('taskStatus', { status: m.task.status });
  if (m.type === 'result') say('result', { text: m.result.content?.[0]?.text, isError: m.result.isError ?? false });
  if (m.type === 'error') say('error', { message: String(m.error) });
}

// A call cancelled by an AbortSignal once it runs (its first progress):
// the SDK sends notifications/cancelled on a POST of its own.
const ac = new AbortController();
try {
  await client.callTool({ name: 'sleepy', arguments: {} }, undefined, {
    signal: ac.signal, timeout: 60000, onprogress: () => ac.abort('the test gave up'),
  });
  say('cancel', { error: 'the call completed' });
} catch (e) {
  say('cancel', { aborted: ac.signal.aborted, error: String(e) });
}
// The aborted call's POST is still open (the SDK does not close it): the
// test checks the command was killed before the client closes.
await new Promise((resolve) => process.stdin.once('data', resolve));
process.stdin.destroy();
await client.close();
