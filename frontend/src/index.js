export function render() { document.body.textContent = "Introspect"; }
