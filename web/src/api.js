// The admin API, as JSON. A failed call throws an ApiError whose message is
// what an operator should read: the problem document's `detail` when the
// server sent one (RFC 9457), else what went wrong on the way.

export class ApiError extends Error {
  constructor(status, title, detail) {
    super(detail || title || 'HTTP ' + status);
    this.status = status;  // 0: no answer
    this.title = title;
  }
}

async function call(method, path, body, timeoutMs) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  try {
    let response;
    try {
      response = await fetch(path, {
        method,
        headers: body === undefined ? {} : {'Content-Type': 'application/json'},
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: abort.signal,
        cache: 'no-store',
        credentials: 'same-origin',
      });
    } catch (e) {
      throw new ApiError(0, 'unreachable', abort.signal.aborted
        ? 'no answer within ' + timeoutMs / 1000 + ' s'
        : 'the admin listener cannot be reached');
    }
    const text = await response.text();
    let json = null;
    try {
      json = JSON.parse(text);
    } catch (e) {
      // Not JSON: said below.
    }
    if (!response.ok) {
      const problem = json !== null && typeof json === 'object' ? json : {};
      const title = typeof problem.title === 'string' ? problem.title : response.statusText;
      const detail = typeof problem.detail === 'string' ? problem.detail : text.slice(0, 300);
      throw new ApiError(response.status, title, 'HTTP ' + response.status + ' ' + title +
        (detail && detail !== title ? ': ' + detail : ''));
    }
    if (json === null) throw new ApiError(response.status, 'bad answer', 'the answer is not JSON');
    return json;
  } catch (e) {
    if (e instanceof ApiError) throw e;
    throw new ApiError(0, 'error', abort.signal.aborted
      ? 'no answer within ' + timeoutMs / 1000 + ' s' : String(e));
  } finally {
    clearTimeout(timer);
  }
}

export function getJson(path, timeoutMs = 5000) {
  return call('GET', path, undefined, timeoutMs);
}

export function postJson(path, body, timeoutMs = 60000) {
  return call('POST', path, body, timeoutMs);
}

// A path segment: every byte but the unreserved ones percent-encoded, "/"
// included, so a key with "/" or "%" or "?" stays one segment.
export function segment(text) {
  return encodeURIComponent(text).replace(/[!'()*]/g,
    (c) => '%' + c.charCodeAt(0).toString(16).toUpperCase());
}
