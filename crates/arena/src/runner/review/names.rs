//! The names a Rust file's `use` declarations and `extern crate` items bind, so a path through
//! an alias (`use std::{fs as disk}`, then `disk::read`) is judged by what it names.

use std::collections::HashMap;

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::visit::Visit;
use syn::{Ident, UseTree};

use super::shape::is_punct;

/// An identifier as its name (`r#fs` is `fs`).
pub(super) fn name(i: &Ident) -> String {
    i.unraw().to_string()
}

/// One name a `use` tree binds (`alias`; none for `as _`), or a glob.
pub(super) struct Import {
    pub alias: Option<String>,
    pub path: Vec<String>,
    pub glob: bool,
    pub span: Span,
}

/// The names `tree` binds under `prefix`.
pub(super) fn imports(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<Import>) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(name(&p.ident));
            imports(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => out.push(bind(prefix, &n.ident, None)),
        UseTree::Rename(r) => out.push(bind(prefix, &r.ident, Some(&r.rename))),
        UseTree::Glob(g) => out.push(Import {
            alias: None,
            path: prefix.clone(),
            glob: true,
            span: g.star_token.span,
        }),
        UseTree::Group(g) => {
            for t in &g.items {
                imports(t, prefix, out);
            }
        }
    }
}

/// `prefix::ident as rename` (`self` names the prefix itself).
fn bind(prefix: &[String], ident: &Ident, rename: Option<&Ident>) -> Import {
    let mut path = prefix.to_vec();
    if ident != "self" {
        path.push(name(ident));
    }
    let alias = match rename {
        Some(r) if r == "_" => None,
        Some(r) => Some(name(r)),
        None => path.last().cloned(),
    };
    Import {
        alias,
        path,
        glob: false,
        span: ident.span(),
    }
}

/// The `use` tree starting after `t[i]` (a `use`), and the index after its `;`.
pub(super) fn use_tree_at(t: &[TokenTree], i: usize) -> Option<(UseTree, usize)> {
    let end = (i + 1..t.len())
        .find(|&j| is_punct(t.get(j), ';'))
        .unwrap_or(t.len());
    let tokens: TokenStream = t[i + 1..end].iter().cloned().collect();
    syn::parse2::<UseTree>(tokens).ok().map(|u| (u, end + 1))
}

/// The `use` trees in a macro's tokens, at any depth.
fn token_uses(tokens: &TokenStream, out: &mut Vec<Import>) {
    let t: Vec<TokenTree> = tokens.clone().into_iter().collect();
    for (i, tt) in t.iter().enumerate() {
        match tt {
            TokenTree::Ident(id) if id == "use" => {
                if let Some((tree, _)) = use_tree_at(&t, i) {
                    imports(&tree, &mut vec![], out);
                }
            }
            TokenTree::Group(g) => token_uses(&g.stream(), out),
            _ => {}
        }
    }
}

/// Every `use` and `extern crate` of a file, macros' tokens included.
#[derive(Default)]
struct Imports(Vec<Import>);

impl<'a> Visit<'a> for Imports {
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        imports(&u.tree, &mut vec![], &mut self.0);
    }

    fn visit_item_extern_crate(&mut self, c: &'a syn::ItemExternCrate) {
        let path = vec![name(&c.ident)];
        let alias = match &c.rename {
            Some((_, r)) if r == "_" => None,
            Some((_, r)) => Some(name(r)),
            None => Some(path[0].clone()),
        };
        self.0.push(Import {
            alias,
            path,
            glob: false,
            span: c.ident.span(),
        });
    }

    fn visit_macro(&mut self, m: &'a syn::Macro) {
        token_uses(&m.tokens, &mut self.0);
    }
}

/// How deep aliases may chain, and how many readings one path may have.
const MAX_ALIAS_DEPTH: usize = 8;
const MAX_READINGS: usize = 16;

/// The names `use` and `extern crate` bring into a file, all scopes together (an alias made in
/// one function counts in all of them, which can only err towards a finding).
#[derive(Default)]
pub(super) struct Names {
    aliases: HashMap<String, Vec<Vec<String>>>,
    /// The modules of `std`, `core` and `alloc` imported whole (`use std::fs::*`).
    std_globs: Vec<Vec<String>>,
}

impl Names {
    pub(super) fn of(file: &syn::File) -> Names {
        let mut found = Imports::default();
        found.visit_file(file);
        let mut names = Names::default();
        for i in &found.0 {
            if let Some(a) = &i.alias {
                names
                    .aliases
                    .entry(a.clone())
                    .or_default()
                    .push(i.path.clone());
            }
        }
        for g in found.0.iter().filter(|i| i.glob && !i.path.is_empty()) {
            let globs: Vec<_> = names
                .resolve(&g.path)
                .into_iter()
                .map(|(p, _)| p)
                .filter(|p| is_std(p))
                .collect();
            names.std_globs.extend(globs);
        }
        names
    }

    /// What `path` may name: through the aliases, and through each `std` glob for a name no
    /// alias binds. Each reading comes with how many of its leading segments a glob supplied.
    pub(super) fn resolve(&self, path: &[String]) -> Vec<(Vec<String>, usize)> {
        let mut out = vec![];
        self.resolve_into(path.to_vec(), 0, &mut out);
        out
    }

    fn resolve_into(&self, path: Vec<String>, depth: usize, out: &mut Vec<(Vec<String>, usize)>) {
        if out.len() >= MAX_READINGS || path.is_empty() {
            return;
        }
        let targets = self
            .aliases
            .get(&path[0])
            .filter(|_| depth < MAX_ALIAS_DEPTH);
        let Some(targets) = targets else {
            if !is_rooted(&path) {
                for g in &self.std_globs {
                    out.push((g.iter().chain(&path).cloned().collect(), g.len()));
                }
            }
            out.push((path, 0));
            return;
        };
        for t in targets {
            let whole: Vec<String> = t.iter().chain(&path[1..]).cloned().collect();
            if t.len() == 1 && t[0] == path[0] {
                out.push((whole, 0)); // `use rand;`: the crate itself
            } else {
                self.resolve_into(whole, depth + 1, out);
            }
        }
    }
}

pub(super) fn is_std(path: &[String]) -> bool {
    matches!(
        path.first().map(String::as_str),
        Some("std" | "core" | "alloc")
    )
}

/// A path that starts from a crate or module of its own, which no glob changes.
fn is_rooted(path: &[String]) -> bool {
    is_std(path)
        || matches!(
            path.first().map(String::as_str),
            Some("crate" | "self" | "super" | "Self")
        )
}
