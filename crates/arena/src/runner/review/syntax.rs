//! What a changed Rust file names, read by its syntax tree (`syn`), for the rules of `RULES`.
//!
//! `review` parses each changed file as the base has it and as the bundle makes it, lists each
//! one's findings (`findings`: rule and resolved name, in the order written) and keeps those the
//! new file has more of than the base. Parsing runs on a thread of its own with a large stack,
//! after `shape` has bounded how deep the file nests (the parser recurses as deep as the code
//! does, and a stack overflow would end the whole runner, not only this review).

use std::collections::{HashMap, HashSet};

use anyhow::{Context, Result};
use proc_macro2::{Delimiter, Spacing, Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{Expr, ForeignItem, Ident, Item, Lit, Member, Meta};

use super::names::{imports, name, use_tree_at, Names};
use super::shape::{attribute_at, is_punct, shape, skip_attribute};
use super::{RULES, UNPARSEABLE};

/// Types that keep state when a static holds them (interior mutability), matched exactly; any
/// `Atomic*` by its prefix; and the bundle's own types built on one (`stateful_types`).
pub const KEEPS_STATE: &[&str] = &[
    "Cell",
    "RefCell",
    "UnsafeCell",
    "SyncUnsafeCell",
    "OnceCell",
    "OnceLock",
    "Once",
    "LazyLock",
    "LazyCell",
    "Lazy",
    "Mutex",
    "RwLock",
    "ReentrantMutex",
    "Condvar",
];

/// Attributes that link, name or place symbols: a `#[no_mangle] extern "C" fn clock_gettime`
/// would replace the C library's clock for the whole process, the clock's code included.
const SYMBOL_ATTRIBUTES: &[&str] = &[
    "link",
    "link_name",
    "no_mangle",
    "export_name",
    "link_section",
];

/// The parser's stack: at `shape`'s bounds syn's deepest recursion (740 nested generics)
/// takes under 48 MiB unoptimised and under 16 MiB as this workspace builds it.
const STACK: usize = 128 << 20;
/// Larger Rust files are not parsed (the surface's caps are far below).
const MAX_BYTES: usize = 4 << 20;

/// A finding: a rule of `RULES` (by index) and what it names.
#[derive(Debug, Clone)]
pub struct Finding {
    pub rule: usize,
    /// What it names, aliases resolved (`std::fs::read`): what the base is compared on.
    pub name: String,
    /// As written (`disk::read`).
    pub written: String,
    pub line: usize,
}

impl Finding {
    fn detail(&self, path: &str) -> String {
        let what = if self.written == self.name {
            self.name.clone()
        } else {
            format!("{}, which is {}", self.written, self.name)
        };
        format!(
            "{path}:{}: added code {} ({what})",
            self.line, RULES[self.rule].why
        )
    }
}

/// The review of the changed Rust files `(path, base text, new text)`: an unparseable file, else
/// the added finding of the earliest rule of `RULES` (the first written of those). An error is
/// the runner's trouble (no thread for the parser), never the solver's.
pub fn review(files: Vec<(String, String, String)>) -> Result<Option<(&'static str, String)>> {
    if files.is_empty() {
        return Ok(None);
    }
    let parser = std::thread::Builder::new()
        .name("review".into())
        .stack_size(STACK)
        .spawn(move || review_here(&files))
        .context("starting the review's parser")?;
    // A panic inside syn is the input's doing: a file the parser cannot read.
    Ok(parser.join().unwrap_or_else(|_| {
        Some((
            UNPARSEABLE,
            "the review's parser failed on the changed Rust files".into(),
        ))
    }))
}

fn review_here(files: &[(String, String, String)]) -> Option<(&'static str, String)> {
    let mut trees = vec![];
    for (path, old, new) in files {
        match parse(new) {
            Ok(tree) => trees.push((path, parse(old).ok(), tree)),
            Err(why) => {
                return Some((
                    UNPARSEABLE,
                    format!("{path}: the review cannot parse it ({why}), so cannot review it"),
                ))
            }
        }
    }
    let stateful = stateful_types(trees.iter().map(|t| &t.2));
    let mut first: Option<(&String, Finding)> = None;
    for (path, old, new) in &trees {
        let base = old
            .as_ref()
            .map(|o| findings(o, &stateful))
            .unwrap_or_default();
        for f in added(base, findings(new, &stateful)) {
            if first.as_ref().is_none_or(|(_, b)| f.rule < b.rule) {
                first = Some((path, f));
            }
        }
    }
    first.map(|(path, f)| (RULES[f.rule].name, f.detail(path)))
}

/// The findings of `new` beyond those of `base`, counted by rule and resolved name (a multiset:
/// the base's three reads of a file allow three, not a fourth).
pub fn added(base: Vec<Finding>, new: Vec<Finding>) -> Vec<Finding> {
    let mut have: HashMap<(usize, String), usize> = HashMap::new();
    for f in base {
        *have.entry((f.rule, f.name)).or_default() += 1;
    }
    new.into_iter()
        .filter(|f| match have.get_mut(&(f.rule, f.name.clone())) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .collect()
}

/// `text` as a syntax tree, or why not: syn's error and its line, or a nesting past `shape`'s.
pub fn parse(text: &str) -> std::result::Result<syn::File, String> {
    if text.len() > MAX_BYTES {
        return Err(format!("{} bytes, above {MAX_BYTES}", text.len()));
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let tokens: TokenStream = text
        .parse()
        .map_err(|e: proc_macro2::LexError| format!("line {}: {e}", e.span().start().line))?;
    shape(tokens)?;
    syn::parse_file(text).map_err(|e| format!("line {}: {e}", e.span().start().line))
}

/// Everything the rules find in `file`, in the order written. `stateful` names the bundle's
/// types that keep state.
pub fn findings(file: &syn::File, stateful: &HashSet<String>) -> Vec<Finding> {
    let names = Names::of(file);
    let mut w = Walker {
        names: &names,
        stateful,
        out: vec![],
    };
    w.visit_file(file);
    w.out
}

/// The first rule of `RULES` whose paths `path` names (with `core` and `alloc` read as `std`),
/// or, for a macro, whose macros its last segment is. The run must reach past the first `glob`
/// segments: through `use std::fs::*`, a name `read` is not known to be `std::fs::read` (the
/// glob's own `use` is the finding), while through `use std::*`, `fs::read` is.
fn path_rule(path: &[String], glob: usize, macro_call: bool) -> Option<usize> {
    let mut segments: Vec<&str> = path.iter().map(String::as_str).collect();
    if matches!(segments.first(), Some(&("core" | "alloc"))) {
        segments[0] = "std";
    }
    let last = *segments.last()?;
    RULES.iter().position(|r| {
        r.paths.iter().any(|p| has_run(&segments, p, glob))
            || (macro_call && r.macros.contains(&last))
    })
}

/// Whether `pattern`'s segments are a run of `segments` ending past the first `after`.
fn has_run(segments: &[&str], pattern: &str, after: usize) -> bool {
    let pattern: Vec<&str> = pattern.split("::").collect();
    segments
        .windows(pattern.len())
        .enumerate()
        .any(|(i, w)| w == pattern.as_slice() && i + pattern.len() > after)
}

fn rule(name: &str) -> usize {
    RULES
        .iter()
        .position(|r| r.name == name)
        .expect("a rule of RULES")
}

fn keeps_state(ident: &str, stateful: &HashSet<String>) -> bool {
    KEEPS_STATE.contains(&ident) || ident.starts_with("Atomic") || stateful.contains(ident)
}

/// The identifiers of a type or an initialiser, and whether it holds a `*mut` or `&mut`.
#[derive(Default)]
struct Parts {
    idents: Vec<String>,
    mutable: bool,
}

impl Parts {
    /// What in it keeps state, if anything does.
    fn state(&self, stateful: &HashSet<String>) -> Option<String> {
        if self.mutable {
            return Some("a mutable pointer".into());
        }
        self.idents
            .iter()
            .find(|i| keeps_state(i, stateful))
            .cloned()
    }

    fn add_tokens(&mut self, tokens: TokenStream) {
        let mut previous = None;
        for t in tokens {
            match &t {
                TokenTree::Ident(i) => {
                    self.mutable |= i == "mut" && matches!(previous, Some('*' | '&'));
                    self.idents.push(name(i));
                }
                TokenTree::Group(g) => self.add_tokens(g.stream()),
                _ => {}
            }
            previous = match &t {
                TokenTree::Punct(p) => Some(p.as_char()),
                _ => None,
            };
        }
    }
}

impl<'a> Visit<'a> for Parts {
    fn visit_ident(&mut self, i: &'a Ident) {
        self.idents.push(name(i));
    }

    fn visit_type_ptr(&mut self, p: &'a syn::TypePtr) {
        self.mutable |= p.mutability.is_some();
        visit::visit_type_ptr(self, p);
    }

    fn visit_type_reference(&mut self, r: &'a syn::TypeReference) {
        self.mutable |= r.mutability.is_some();
        visit::visit_type_reference(self, r);
    }

    fn visit_expr_reference(&mut self, r: &'a syn::ExprReference) {
        self.mutable |= r.mutability.is_some();
        visit::visit_expr_reference(self, r);
    }

    fn visit_macro(&mut self, m: &'a syn::Macro) {
        self.add_tokens(m.tokens.clone());
        visit::visit_macro(self, m);
    }
}

/// The types the bundle's files define (structs, enums, unions, aliases) that keep state through
/// what they hold, directly or through one another.
pub fn stateful_types<'a>(files: impl IntoIterator<Item = &'a syn::File>) -> HashSet<String> {
    let mut defs = Definitions::default();
    for f in files {
        defs.visit_file(f);
    }
    let mut set = HashSet::new();
    loop {
        let before = set.len();
        for (name, parts) in &defs.0 {
            if !set.contains(name) && parts.state(&set).is_some() {
                set.insert(name.clone());
            }
        }
        if set.len() == before {
            return set;
        }
    }
}

#[derive(Default)]
struct Definitions(Vec<(String, Parts)>);

impl Definitions {
    fn add(&mut self, ident: &Ident, what: impl FnOnce(&mut Parts)) {
        let mut parts = Parts::default();
        what(&mut parts);
        self.0.push((name(ident), parts));
    }
}

impl<'a> Visit<'a> for Definitions {
    fn visit_item_struct(&mut self, s: &'a syn::ItemStruct) {
        self.add(&s.ident, |p| p.visit_fields(&s.fields));
        visit::visit_item_struct(self, s);
    }

    fn visit_item_enum(&mut self, e: &'a syn::ItemEnum) {
        self.add(&e.ident, |p| {
            e.variants.iter().for_each(|v| p.visit_variant(v))
        });
        visit::visit_item_enum(self, e);
    }

    fn visit_item_union(&mut self, u: &'a syn::ItemUnion) {
        self.add(&u.ident, |p| p.visit_fields_named(&u.fields));
        visit::visit_item_union(self, u);
    }

    fn visit_item_type(&mut self, t: &'a syn::ItemType) {
        self.add(&t.ident, |p| p.visit_type(&t.ty));
        visit::visit_item_type(self, t);
    }
}

/// The walk over one file's syntax tree.
struct Walker<'a> {
    names: &'a Names,
    stateful: &'a HashSet<String>,
    out: Vec<Finding>,
}

impl Walker<'_> {
    fn find(&mut self, rule: usize, name: String, written: String, span: Span) {
        self.out.push(Finding {
            rule,
            name,
            written,
            line: span.start().line,
        });
    }

    fn find_as_is(&mut self, rule: usize, name: String, span: Span) {
        self.find(rule, name.clone(), name, span);
    }

    /// A path as written, judged by what it may name.
    fn path(&mut self, written: &[String], macro_call: bool, span: Span) {
        let bang = if macro_call { "!" } else { "" };
        for (named, glob) in self.names.resolve(written) {
            if let Some(rule) = path_rule(&named, glob, macro_call) {
                let shown = |p: &[String]| format!("{}{bang}", p.join("::"));
                self.find(rule, shown(&named), shown(written), span);
                return;
            }
        }
    }

    fn syn_path(&mut self, p: &syn::Path, macro_call: bool) {
        let written: Vec<String> = p.segments.iter().map(|s| name(&s.ident)).collect();
        let span = p
            .segments
            .first()
            .map_or_else(Span::call_site, |s| s.ident.span());
        self.path(&written, macro_call, span);
    }

    fn ident(&mut self, i: &Ident) {
        let n = name(i);
        if let Some(rule) = RULES
            .iter()
            .position(|r| r.idents.iter().any(|x| n.contains(x)))
        {
            self.find_as_is(rule, n, i.span());
        }
    }

    fn literal(&mut self, value: &str, span: Span) {
        let lower = value.to_lowercase();
        if let Some(rule) = RULES
            .iter()
            .position(|r| r.literals.iter().any(|x| lower.contains(x)))
        {
            let shown: String = value.chars().take(80).collect();
            self.find_as_is(rule, format!("{shown:?}"), span);
        }
    }

    /// `receiver.method(…)`, with the receiver's last name where it has one.
    fn method(&mut self, receiver: Option<String>, method: &Ident) {
        let m = name(method);
        let matches = |pattern: &&str| match pattern.split_once('.') {
            Some((r, n)) => n == m && (r.is_empty() || receiver.as_deref() == Some(r)),
            None => false,
        };
        if let Some(rule) = RULES.iter().position(|r| r.methods.iter().any(matches)) {
            let shown = format!("{}.{m}()", receiver.unwrap_or_default());
            self.find_as_is(rule, shown, method.span());
        }
    }

    /// A static named `ident`: mutable, or holding what keeps state.
    fn static_item(&mut self, ident: Option<&Ident>, mutable: bool, parts: &Parts, span: Span) {
        let held = if mutable {
            Some("mut".to_string())
        } else {
            parts.state(self.stateful)
        };
        if let Some(held) = held {
            let n = ident.map(name).unwrap_or_default();
            self.find_as_is(rule("output_cache"), format!("static {n} ({held})"), span);
        }
    }

    /// An attribute's names (`#[no_mangle]`, `#[unsafe(export_name = …)]`, `#[link(…)]`).
    fn attribute_names(&mut self, path: &syn::Path, tokens: Option<&TokenStream>) {
        let mut parts = Parts::default();
        parts.visit_path(path);
        if let Some(t) = tokens {
            parts.add_tokens(t.clone());
        }
        let span = path
            .segments
            .first()
            .map_or_else(Span::call_site, |s| s.ident.span());
        for n in parts
            .idents
            .iter()
            .filter(|n| SYMBOL_ATTRIBUTES.contains(&n.as_str()))
        {
            self.find_as_is(rule("escape"), format!("#[{n}]"), span);
        }
    }

    /// `#[path = "…"]` on a module: a file outside the bundle's Rust, compiled in.
    fn module_path(&mut self, value: &str, span: Span) {
        let inside = value.ends_with(".rs")
            && !value.starts_with('/')
            && !value.split(['/', '\\']).any(|c| c == "..");
        if !inside {
            self.find_as_is(rule("reads_files"), format!("#[path = {value:?}]"), span);
        }
    }
}

impl<'a> Visit<'a> for Walker<'_> {
    fn visit_path(&mut self, p: &'a syn::Path) {
        self.syn_path(p, false);
        visit::visit_path(self, p);
    }

    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let mut found = vec![];
        imports(&u.tree, &mut vec![], &mut found);
        for i in found {
            self.path(&i.path, false, i.span);
        }
        visit::visit_item_use(self, u);
    }

    fn visit_item_extern_crate(&mut self, c: &'a syn::ItemExternCrate) {
        self.path(&[name(&c.ident)], false, c.ident.span());
        visit::visit_item_extern_crate(self, c);
    }

    fn visit_macro(&mut self, m: &'a syn::Macro) {
        self.syn_path(&m.path, true);
        for s in &m.path.segments {
            self.ident(&s.ident);
        }
        self.tokens(&m.tokens);
    }

    fn visit_item_static(&mut self, s: &'a syn::ItemStatic) {
        let mut parts = Parts::default();
        parts.visit_type(&s.ty);
        parts.visit_expr(&s.expr);
        let mutable = matches!(s.mutability, syn::StaticMutability::Mut(_));
        self.static_item(Some(&s.ident), mutable, &parts, s.ident.span());
        visit::visit_item_static(self, s);
    }

    fn visit_item_foreign_mod(&mut self, f: &'a syn::ItemForeignMod) {
        let abi = f.abi.name.as_ref().map_or("C".into(), |n| n.value());
        let span = f.abi.extern_token.span;
        if f.items.is_empty() {
            self.find_as_is(rule("escape"), format!("extern {abi:?} {{}}"), span);
        }
        for item in &f.items {
            let (kind, ident) = match item {
                ForeignItem::Fn(x) => ("fn", Some(&x.sig.ident)),
                ForeignItem::Static(x) => ("static", Some(&x.ident)),
                ForeignItem::Type(x) => ("type", Some(&x.ident)),
                _ => ("item", None),
            };
            let n = ident.map(name).unwrap_or_default();
            let span = ident.map_or(span, Ident::span);
            self.find_as_is(rule("escape"), format!("extern {abi:?} {kind} {n}"), span);
        }
        visit::visit_item_foreign_mod(self, f);
    }

    fn visit_attribute(&mut self, a: &'a syn::Attribute) {
        match &a.meta {
            // A doc comment is prose.
            Meta::NameValue(nv) if nv.path.is_ident("doc") && matches!(nv.value, Expr::Lit(_)) => {}
            Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                Expr::Lit(syn::ExprLit {
                    lit: Lit::Str(s), ..
                }) => self.module_path(&s.value(), s.span()),
                v => self.visit_expr(v),
            },
            Meta::NameValue(nv) => {
                self.attribute_names(&nv.path, None);
                self.visit_expr(&nv.value);
            }
            Meta::Path(p) => self.attribute_names(p, None),
            Meta::List(l) => {
                self.attribute_names(&l.path, Some(&l.tokens));
                self.tokens(&l.tokens);
            }
        }
    }

    fn visit_expr_method_call(&mut self, m: &'a syn::ExprMethodCall) {
        let receiver = match &*m.receiver {
            Expr::Field(f) => match &f.member {
                Member::Named(i) => Some(name(i)),
                Member::Unnamed(_) => None,
            },
            Expr::Path(p) => p.path.segments.last().map(|s| name(&s.ident)),
            _ => None,
        };
        self.method(receiver, &m.method);
        visit::visit_expr_method_call(self, m);
    }

    fn visit_ident(&mut self, i: &'a Ident) {
        self.ident(i);
    }

    fn visit_lit_str(&mut self, s: &'a syn::LitStr) {
        self.literal(&s.value(), s.span());
    }

    fn visit_lit_byte_str(&mut self, s: &'a syn::LitByteStr) {
        self.literal(&String::from_utf8_lossy(&s.value()), s.span());
    }

    // What syn keeps as tokens (syntax it does not model) is read as tokens.
    fn visit_item(&mut self, i: &'a Item) {
        if let Item::Verbatim(t) = i {
            self.tokens(t);
        }
        visit::visit_item(self, i);
    }

    fn visit_expr(&mut self, e: &'a Expr) {
        if let Expr::Verbatim(t) = e {
            self.tokens(t);
        }
        visit::visit_expr(self, e);
    }

    fn visit_type(&mut self, t: &'a syn::Type) {
        if let syn::Type::Verbatim(v) = t {
            self.tokens(v);
        }
        visit::visit_type(self, t);
    }

    fn visit_pat(&mut self, p: &'a syn::Pat) {
        if let syn::Pat::Verbatim(v) = p {
            self.tokens(v);
        }
        visit::visit_pat(self, p);
    }

    fn visit_foreign_item(&mut self, i: &'a ForeignItem) {
        if let ForeignItem::Verbatim(v) = i {
            self.tokens(v);
        }
        visit::visit_foreign_item(self, i);
    }

    fn visit_impl_item(&mut self, i: &'a syn::ImplItem) {
        if let syn::ImplItem::Verbatim(v) = i {
            self.tokens(v);
        }
        visit::visit_impl_item(self, i);
    }

    fn visit_trait_item(&mut self, i: &'a syn::TraitItem) {
        if let syn::TraitItem::Verbatim(v) = i {
            self.tokens(v);
        }
        visit::visit_trait_item(self, i);
    }
}

/// Tokens syn leaves unparsed: a macro's input, a `macro_rules!` body, an attribute's arguments.
/// Read for their paths (a run of identifiers joined by `::`, a macro when `!` and a group
/// follow), `use` trees, statics, `extern` blocks, attributes, method calls, identifiers and
/// literals, and for a macro called through a fragment (`$m!(…)`, `$($m)*!(…)`), which turns a
/// name its caller passes (`include_bytes`, `env`, `asm`) into a macro call.
impl Walker<'_> {
    fn tokens(&mut self, tokens: &TokenStream) {
        let t: Vec<TokenTree> = tokens.clone().into_iter().collect();
        let mut i = 0;
        while i < t.len() {
            i = match &t[i] {
                TokenTree::Group(g) => {
                    self.tokens(&g.stream());
                    i + 1
                }
                TokenTree::Literal(l) => {
                    self.token_literal(l);
                    i + 1
                }
                TokenTree::Punct(_) => self.token_punct(&t, i),
                TokenTree::Ident(_) => self.token_ident(&t, i),
            };
        }
    }

    fn token_literal(&mut self, l: &proc_macro2::Literal) {
        match Lit::new(l.clone()) {
            Lit::Str(s) => self.literal(&s.value(), l.span()),
            Lit::ByteStr(b) => self.literal(&String::from_utf8_lossy(&b.value()), l.span()),
            _ => {}
        }
    }

    /// `#[…]`, `$m!(…)`, `.method(…)`; the index after what was read.
    fn token_punct(&mut self, t: &[TokenTree], i: usize) -> usize {
        let TokenTree::Punct(p) = &t[i] else {
            return i + 1;
        };
        match p.as_char() {
            '#' => {
                if let Some(g) = attribute_at(t, i) {
                    if let Ok(meta) = syn::parse2::<Meta>(g.stream()) {
                        self.visit_attribute(&syn::Attribute {
                            pound_token: Default::default(),
                            style: syn::AttrStyle::Outer,
                            bracket_token: Default::default(),
                            meta,
                        });
                        return skip_attribute(t, i);
                    }
                }
                i + 1
            }
            '$' => self.fragment_call(t, i),
            '.' => match t.get(i + 1) {
                Some(TokenTree::Ident(m)) => {
                    if matches!(t.get(i + 2), Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis)
                    {
                        let receiver = match i.checked_sub(1).and_then(|j| t.get(j)) {
                            Some(TokenTree::Ident(r)) => Some(name(r)),
                            _ => None,
                        };
                        self.method(receiver, m);
                    }
                    self.ident(m);
                    i + 2
                }
                _ => i + 1,
            },
            _ => i + 1,
        }
    }

    /// After a `$` of a `macro_rules!` body: a macro called through a fragment is an escape (it
    /// calls whatever its caller names); the fragment's own name is not a path.
    fn fragment_call(&mut self, t: &[TokenTree], i: usize) -> usize {
        let bang_call = |j: usize| {
            matches!(t.get(j), Some(TokenTree::Punct(p)) if p.as_char() == '!' && p.spacing() == Spacing::Alone)
                && matches!(t.get(j + 1), Some(TokenTree::Group(_)))
        };
        let repetition = |j: usize| matches!(t.get(j), Some(TokenTree::Punct(p)) if matches!(p.as_char(), '*' | '+' | '?'));
        match t.get(i + 1) {
            Some(TokenTree::Ident(m)) => {
                if bang_call(i + 2) {
                    let n = format!("${}!", name(m));
                    self.find_as_is(rule("escape"), n, m.span());
                }
                i + 2
            }
            Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis => {
                let op = if repetition(i + 2) { i + 2 } else { i + 3 };
                if repetition(op) && bang_call(op + 1) {
                    self.find_as_is(rule("escape"), "$(…)!".into(), g.span());
                }
                i + 1
            }
            _ => i + 1,
        }
    }

    /// An identifier: `use`, `static`, `extern`, or a path; the index after what was read.
    fn token_ident(&mut self, t: &[TokenTree], i: usize) -> usize {
        let TokenTree::Ident(id) = &t[i] else {
            return i + 1;
        };
        // A lifetime or a label (`'static`).
        if i > 0 && is_punct(t.get(i - 1), '\'') {
            return i + 1;
        }
        if id == "use" {
            if let Some((tree, next)) = use_tree_at(t, i) {
                let mut found = vec![];
                imports(&tree, &mut vec![], &mut found);
                for f in found {
                    self.path(&f.path, false, f.span);
                }
                return next;
            }
        }
        if id == "static" {
            self.token_static(t, i);
            return i + 1;
        }
        if id == "extern" {
            let block_at = if matches!(t.get(i + 1), Some(TokenTree::Literal(_))) {
                i + 2
            } else {
                i + 1
            };
            if matches!(t.get(block_at), Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace)
            {
                self.find_as_is(rule("escape"), "extern block".into(), id.span());
            }
            return i + 1;
        }
        self.token_path(t, i)
    }

    /// The path starting at `t[i]`: identifiers joined by `::`, a macro when `!` and a group
    /// follow.
    fn token_path(&mut self, t: &[TokenTree], i: usize) -> usize {
        let mut idents = vec![];
        let mut j = i;
        while let Some(TokenTree::Ident(id)) = t.get(j) {
            idents.push(id.clone());
            let joined = matches!(t.get(j + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == Spacing::Joint)
                && is_punct(t.get(j + 2), ':');
            if !joined || !matches!(t.get(j + 3), Some(TokenTree::Ident(_))) {
                j += 1;
                break;
            }
            j += 3;
        }
        let macro_call = matches!(t.get(j), Some(TokenTree::Punct(p)) if p.as_char() == '!' && p.spacing() == Spacing::Alone)
            && matches!(t.get(j + 1), Some(TokenTree::Group(_)));
        let written: Vec<String> = idents.iter().map(name).collect();
        self.path(&written, macro_call, idents[0].span());
        for id in &idents {
            self.ident(id);
        }
        j
    }

    /// `static` in tokens: mutable, or holding what keeps state (its type and initialiser, up to
    /// the `;`).
    fn token_static(&mut self, t: &[TokenTree], i: usize) {
        let mutable = matches!(t.get(i + 1), Some(TokenTree::Ident(m)) if m == "mut");
        let ident = match t.get(i + 1 + usize::from(mutable)) {
            Some(TokenTree::Ident(n)) => Some(n),
            _ => None,
        };
        let end = (i + 1..t.len())
            .find(|&j| is_punct(t.get(j), ';'))
            .unwrap_or(t.len());
        let mut parts = Parts::default();
        parts.add_tokens(t[i + 1..end].iter().cloned().collect());
        self.static_item(ident, mutable, &parts, t[i].span());
    }
}
