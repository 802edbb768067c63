//! Kernel parameters by name: each kernel's parameters are a struct whose fields are declared in
//! the kernel's parameter order and named as the `.cu` source names them, so a launch names every
//! argument and a kernel's order lives in one place, next to its name. `Gpu::run` launches one
//! (device.rs's `Launch`, whose errors name the kernel); the unit test below parses every kernel's
//! signature from its source and checks the fields' names, order and count against it.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use crate::device::{Gpu, Kernel, Launch};
use crate::error::Result;

/// A kernel's parameters, pushed in the kernel's order.
pub(crate) trait KernelParams {
    /// The kernel module (`nvrtc::MODULES`).
    const MODULE: &'static str;
    /// The name of the `__global__` function whose signature the fields follow: the kernel's
    /// own, or the name its entry macro gives it (`NAME` for dense.cu's `GEMV_ENTRY`).
    const SIGNATURE: &'static str;
    /// The fields' names, in order: the kernel's parameter names (read by the tests, which
    /// check them against the kernel's source).
    #[cfg_attr(not(test), allow(dead_code))]
    const FIELDS: &'static [&'static str];
    /// Pushes the fields, in order, as the launch's arguments.
    fn push<'l>(&'l mut self, launch: &mut Launch<'l>);
}

/// `kernel_params! { /// doc  struct Name<'a, T>("module", "signature") { field: Type, ... } }`
/// declares the struct and its `KernelParams`. Field names are the kernel's parameter names
/// (upper-case ones included: moe.cu's `H` and `h` are different parameters).
macro_rules! kernel_params {
    ($(
        $(#[$meta:meta])*
        $vis:vis struct $name:ident<$($gen:tt),+>($module:literal, $sig:literal) {
            $($field:ident: $ty:ty),* $(,)?
        }
    )*) => {$(
        $(#[$meta])*
        #[allow(non_snake_case)]
        $vis struct $name<$($gen),+> {
            $(pub $field: $ty,)*
        }

        impl<$($gen),+> $crate::params::KernelParams for $name<$($gen),+> {
            const MODULE: &'static str = $module;
            const SIGNATURE: &'static str = $sig;
            const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];
            fn push<'l>(&'l mut self, launch: &mut $crate::device::Launch<'l>) {
                $($crate::params::Arg::push_to(&mut self.$field, launch);)*
            }
        }
    )*};
}
pub(crate) use kernel_params;

/// A field's value as a kernel argument: a scalar by address, a device buffer by its pointer.
pub(crate) trait Arg {
    fn push_to<'l>(&'l mut self, launch: &mut Launch<'l>);
}

macro_rules! scalar_arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn push_to<'l>(&'l mut self, launch: &mut Launch<'l>) {
                launch.arg(&*self);
            }
        }
    )*};
}
scalar_arg!(i32, u32, f32, u64, i64);

impl<T> Arg for &CudaSlice<T> {
    fn push_to<'l>(&'l mut self, launch: &mut Launch<'l>) {
        launch.arg(*self);
    }
}

impl<T> Arg for &mut CudaSlice<T> {
    fn push_to<'l>(&'l mut self, launch: &mut Launch<'l>) {
        launch.arg(&mut **self);
    }
}

impl<T> Arg for &CudaView<'_, T> {
    fn push_to<'l>(&'l mut self, launch: &mut Launch<'l>) {
        launch.arg(*self);
    }
}

/// The null device pointer an absent optional buffer passes.
static NULL: u64 = 0;

/// An optional buffer: None passes a null pointer.
impl<T> Arg for Option<&CudaView<'_, T>> {
    fn push_to<'l>(&'l mut self, launch: &mut Launch<'l>) {
        match self {
            Some(v) => launch.arg(*v),
            None => launch.arg(&NULL),
        };
    }
}

/// An optional written buffer: None passes a null pointer.
impl<T> Arg for Option<CudaViewMut<'_, T>> {
    fn push_to<'l>(&'l mut self, launch: &mut Launch<'l>) {
        match self {
            Some(v) => launch.arg(v),
            None => launch.arg(&NULL),
        };
    }
}

impl<T> Arg for Option<&mut CudaSlice<T>> {
    fn push_to<'l>(&'l mut self, launch: &mut Launch<'l>) {
        match self {
            Some(v) => launch.arg(&mut **v),
            None => launch.arg(&NULL),
        };
    }
}

/// A written view is held by value (`view.slice_mut(..)` reborrows one): a struct's several
/// views then need no lifetime each.
impl<T> Arg for CudaViewMut<'_, T> {
    fn push_to<'l>(&'l mut self, launch: &mut Launch<'l>) {
        launch.arg(self);
    }
}

/// Whether a launch may overlap its predecessor's tail (device.rs, `Launch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// Programmatic while the GPU's launches are (`Gpu::launch`): the kernel calls `pdl_wait()`.
    Overlapping,
    /// After the predecessor has finished (`Gpu::launch_ordered`): the prefill path, the weight
    /// generator.
    AfterPredecessor,
}

impl Gpu {
    /// Launches `P`'s kernel (its signature's name) with `params`.
    ///
    /// # Safety
    /// The kernel must stay within the buffers it is given.
    pub(crate) unsafe fn run<P: KernelParams>(
        &self,
        order: Order,
        params: P,
        cfg: LaunchConfig,
    ) -> Result<()> {
        let f = self.function(P::MODULE, P::SIGNATURE)?;
        // SAFETY: passed on to the caller.
        unsafe { self.run_kernel(&f, order, params, cfg) }
    }

    /// Launches `f`, an entry of `P`'s module with `P`'s signature, with `params`.
    ///
    /// # Safety
    /// `f` must take `P`'s parameters and stay within the buffers it is given.
    pub(crate) unsafe fn run_kernel<P: KernelParams>(
        &self,
        f: &Kernel,
        order: Order,
        mut params: P,
        cfg: LaunchConfig,
    ) -> Result<()> {
        let mut launch = match order {
            Order::Overlapping => self.launch(f),
            Order::AfterPredecessor => self.launch_ordered(f),
        };
        params.push(&mut launch);
        // SAFETY: the fields are the kernel's parameters in its order (checked against its
        // source by the tests below); the caller vouches for the buffers.
        unsafe { launch.launch(cfg) }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// The parameter names of `__global__` function `name` in `src` (common.cuh and the module):
    /// the last identifier of each parameter, a parameter-list macro (`ATTEND_DECODE_ARGS`)
    /// expanded from its `#define`.
    pub(crate) fn kernel_params(src: &str, name: &str) -> Vec<String> {
        // Macro bodies continue over lines ending in a backslash.
        let text = src.replace("\\\n", " ");
        let at = text
            .match_indices("__global__")
            .find_map(|(i, _)| {
                let rest = &text[i..];
                let open = rest.find('(')?;
                let head = &rest[..open];
                // `__launch_bounds__(...)` comes before the name: skip to the name's parenthesis.
                let (head, open) = if head.contains("__launch_bounds__") {
                    let close = rest.find(')')?;
                    let open2 = close + 1 + rest[close + 1..].find('(')?;
                    (&rest[close + 1..open2], open2)
                } else {
                    (head, open)
                };
                (head.split_whitespace().last() == Some(name)).then_some(i + open)
            })
            .unwrap_or_else(|| panic!("no __global__ function {name}"));
        let list = balanced(&text[at..]);
        let list = match list.trim() {
            m if !m.is_empty() && m.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                define_body(&text, m)
            }
            l => l.to_string(),
        };
        split_top(&list)
            .iter()
            .map(|p| {
                p.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .rfind(|t| !t.is_empty())
                    .unwrap_or_else(|| panic!("{name}: a parameter without a name: {p:?}"))
                    .to_string()
            })
            .collect()
    }

    /// The text inside the parentheses opening `s`.
    fn balanced(s: &str) -> &str {
        let mut depth = 0;
        for (i, c) in s.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return &s[1..i];
                    }
                }
                _ => {}
            }
        }
        panic!("unbalanced parentheses")
    }

    /// The body of `#define NAME body` in `text`.
    fn define_body(text: &str, name: &str) -> String {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("#define "))
            .find_map(|l| l.strip_prefix(name).filter(|b| b.starts_with(' ')))
            .unwrap_or_else(|| panic!("no #define {name}"))
            .to_string()
    }

    /// `s` split at its top-level commas.
    fn split_top(s: &str) -> Vec<&str> {
        let (mut out, mut depth, mut start) = (vec![], 0, 0);
        for (i, c) in s.char_indices() {
            match c {
                '(' | '<' => depth += 1,
                ')' | '>' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(&s[start..]);
        out.into_iter().filter(|p| !p.trim().is_empty()).collect()
    }

    /// Checks `P`'s fields against its kernel's signature in the module's source.
    pub(crate) fn check<P: super::KernelParams>() {
        check_entry::<P>(P::SIGNATURE)
    }

    /// Checks `P`'s fields against the signature of `entry`, another kernel launched with them.
    pub(crate) fn check_entry<P: super::KernelParams>(entry: &str) {
        let src = crate::nvrtc::MODULES
            .iter()
            .find(|(n, _)| *n == P::MODULE)
            .unwrap_or_else(|| panic!("no kernel module {}", P::MODULE))
            .1;
        let full = format!("{}\n{src}", include_str!("../kernels/common.cuh"));
        let want = kernel_params(&full, entry);
        // A field named by a Rust keyword is a raw identifier (`r#in`).
        let fields: Vec<_> = P::FIELDS
            .iter()
            .map(|f| f.trim_start_matches("r#"))
            .collect();
        assert_eq!(
            fields,
            want.iter().map(String::as_str).collect::<Vec<_>>(),
            "{}::{entry}: the struct's fields against the kernel's parameters",
            P::MODULE,
        );
    }

    #[test]
    fn signatures_are_parsed_through_launch_bounds_and_argument_macros() {
        let src = "#define ARGS const float* __restrict__ x, \\\n int n\n\
                   extern \"C\" __global__ void __launch_bounds__(256, 1) k(ARGS) {}\n\
                   extern \"C\" __global__ void j(const uint4 *__restrict__ w, float eps) {}";
        assert_eq!(kernel_params(src, "k"), ["x", "n"]);
        assert_eq!(kernel_params(src, "j"), ["w", "eps"]);
    }
}
